//===- Connect.h - a rank joins its job ---------------------------------------===//
//
// The rendezvous (c10d::TCPStore; every rank's plan hash and version
// checked) and the world communicator (Gloo) from a rank's JoinOptions:
// shared by training workers and calibration workers.
//
//===----------------------------------------------------------------------===//
#ifndef HFLOW_RUNTIME_EXEC_CONNECT_H
#define HFLOW_RUNTIME_EXEC_CONNECT_H

#include "runtime/comm/Communicator.h"
#include "runtime/comm/Rendezvous.h"
#include "runtime/exec/RunOptions.h"

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace hflow::exec {

/// Joins the job's rendezvous; every rank must run the same plan and hflow
/// version and agree on `agree` (named facts: options, data, job identity).
/// HFLOW_TEST_FAKE_VERSION replaces the version (tests of the mismatch).
/// Throws comm::RendezvousError.
std::unique_ptr<comm::Rendezvous>
joinJob(const JoinOptions &j, uint64_t planHash,
        std::vector<std::pair<std::string, std::string>> agree = {});
/// The world communicator over the rendezvous' store: Gloo, or NCCL on the
/// local rank's GPU when `comm` is "nccl". Throws CommError.
std::unique_ptr<comm::Communicator> createWorld(const comm::Rendezvous &rv,
                                                const JoinOptions &j,
                                                const std::string &comm = "gloo");

} // namespace hflow::exec

#endif // HFLOW_RUNTIME_EXEC_CONNECT_H
