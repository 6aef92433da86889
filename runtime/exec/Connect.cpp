//===- Connect.cpp - a rank joins its job -------------------------------------===//
#include "runtime/exec/Connect.h"

#include "runtime/comm/C10dCommunicator.h"

#include <cstdlib>

namespace hflow::exec {

std::unique_ptr<comm::Rendezvous>
joinJob(const JoinOptions &j, uint64_t planHash,
        std::vector<std::pair<std::string, std::string>> agree) {
  comm::RendezvousOptions ro;
  ro.masterAddr = j.masterAddr;
  ro.masterPort = j.masterPort;
  ro.rank = j.rank;
  ro.worldSize = j.worldSize;
  ro.timeout = j.timeout;
  ro.planHash = planHash;
  ro.version = j.version;
  ro.agree = std::move(agree);
  if (const char *v = std::getenv("HFLOW_TEST_FAKE_VERSION"); v && *v)
    ro.version = v;
  return comm::Rendezvous::join(ro);
}

std::unique_ptr<comm::Communicator> createWorld(const comm::Rendezvous &rv,
                                                const JoinOptions &j, const std::string &comm) {
  comm::C10dOptions go;
  if (comm == "nccl") {
    go.backend = comm::C10dBackendKind::Nccl;
    go.cudaDevice = j.cudaDevice;
  }
  go.host = comm::glooHostFor(j.masterAddr);
  go.timeout = j.timeout;
  return comm::C10dCommunicator::createWorld(rv, go);
}

} // namespace hflow::exec
