//===- OutputFilesTest.cpp - runtime/schema/OutputFiles and the run's outputs -===//
//
// The rules every hflow tool writes by: whole files through a temporary file,
// checked writes (a file-size limit stands in for a full disk), records that
// stay whole, outputs that never name inputs, folders that hold only what
// hflow wrote, and locks that name the job holding them. Then the run's
// metrics rows a resume keeps (RunOutputs::rowsBefore).
//
//===----------------------------------------------------------------------===//
#include "runtime/exec/RunOutputs.h"
#include "runtime/schema/OutputFiles.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;
using namespace hflow;
using namespace hflow::outputs;

namespace {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/hflow-outputs-XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string &name) const { return path + "/" + name; }
};

std::string slurp(const std::string &p) {
  std::ifstream in(p, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void put(const std::string &p, const std::string &text) { std::ofstream(p) << text; }

std::vector<std::string> names(const std::string &dir) {
  std::vector<std::string> out;
  for (const auto &e : fs::directory_iterator(dir))
    out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// Runs `f` in a child process under a file-size limit of `bytes` (what a
/// full disk looks like to a writer: EFBIG) and returns what it returned.
std::string underFileSizeLimit(rlim_t bytes, const std::function<std::string()> &f) {
  int pipefd[2];
  EXPECT_EQ(::pipe(pipefd), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(pipefd[0]);
    ignoreFileSizeSignal();
    struct rlimit rl = {bytes, bytes};
    ::setrlimit(RLIMIT_FSIZE, &rl);
    const std::string r = f();
    (void)!::write(pipefd[1], r.data(), r.size());
    ::_exit(0);
  }
  ::close(pipefd[1]);
  std::string out;
  char buf[512];
  ssize_t n;
  while ((n = ::read(pipefd[0], buf, sizeof buf)) > 0)
    out.append(buf, (size_t)n);
  ::close(pipefd[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status)) << "the child was killed by signal " << WTERMSIG(status);
  return out;
}

} // namespace

TEST(OutputFiles, WholeFileReplacesTheTargetOnlyWhenComplete) {
  TempDir d;
  const std::string p = d / "plan.bin";
  EXPECT_EQ(writeWholeFile(p, "first"), "");
  EXPECT_EQ(slurp(p), "first");
  {
    AtomicFile f;
    ASSERT_EQ(f.open(p), "");
    EXPECT_EQ(f.tempPath(), d / ".plan.bin.hflow-tmp-" + std::to_string(::getpid()));
    EXPECT_EQ(f.write("second, not finished"), "");
    EXPECT_EQ(slurp(p), "first"); // not until commit
  }
  EXPECT_EQ(slurp(p), "first");
  EXPECT_EQ(names(d.path), std::vector<std::string>{"plan.bin"}); // no temporary file left
  // A link is followed: the file it points at is replaced, the link kept.
  fs::create_symlink(p, d / "link.bin");
  EXPECT_EQ(writeWholeFile(d / "link.bin", "third"), "");
  EXPECT_TRUE(fs::is_symlink(d / "link.bin"));
  EXPECT_EQ(slurp(p), "third");
  // A folder is refused; a missing folder says so.
  EXPECT_EQ(writeWholeFile(d.path, "x"), "cannot write '" + d.path + "': it is a directory");
  EXPECT_EQ(writeWholeFile(d / "no/such/f", "x"),
            "cannot write '" + d / "no/such/f" + "': No such file or directory");
}

TEST(OutputFiles, EveryWriteIsChecked) {
  TempDir d;
  const std::string p = d / "metrics.jsonl";
  put(p, "the earlier file\n");
  // A full disk: the write fails, the temporary file goes, the target stays.
  const std::string big(100000, 'x');
  EXPECT_EQ(underFileSizeLimit(4096, [&] { return writeWholeFile(p, big); }),
            "cannot write '" + p + "': File too large");
  EXPECT_EQ(slurp(p), "the earlier file\n");
  EXPECT_EQ(names(d.path), std::vector<std::string>{"metrics.jsonl"});
  // A device that is full: written in place, and the error is reported.
  EXPECT_EQ(writeWholeFile("/dev/full", "x"), "cannot write '/dev/full': No space left on device");
  EXPECT_TRUE(fs::is_character_file("/dev/full")); // never replaced by a regular file
}

TEST(OutputFiles, RecordLogEndsInWholeRecords) {
  TempDir d;
  const std::string p = d / "m.jsonl";
  put(p, "an older run's rows\n");
  // Under a 1,000-byte limit, rows of 300 bytes: three fit, the fourth fails
  // and is cut back; publish renames the whole rows over the file.
  const std::string row = std::string(299, 'r') + "\n";
  const std::string got = underFileSizeLimit(1000, [&] {
    RecordLog log;
    if (std::string e = log.open(p, "{\"kept\": 1}\n"); !e.empty())
      return e;
    std::string err;
    for (int i = 0; i < 5 && err.empty(); ++i)
      err = log.append(row);
    std::string pub = log.publish();
    return err + "|" + pub;
  });
  EXPECT_EQ(got, "cannot write '" + RecordLog::partialPath(p) + "': File too large|");
  const std::string text = slurp(p);
  EXPECT_EQ(text, "{\"kept\": 1}\n" + row + row + row);
  EXPECT_FALSE(fs::exists(RecordLog::partialPath(p)));
  // readRecords prefers the partial file a killed job left.
  put(RecordLog::partialPath(p), "a\nb\ntorn");
  std::string rec;
  EXPECT_EQ(readRecords(p, rec), "");
  EXPECT_EQ(rec, "a\nb\n");
  fs::remove(RecordLog::partialPath(p));
  EXPECT_EQ(readRecords(p, rec), "");
  EXPECT_EQ(rec, text);
  EXPECT_EQ(readRecords(d / "none.jsonl", rec), "");
  EXPECT_EQ(rec, "");
}

TEST(OutputFiles, OutputsNeverNameInputsOrEachOther) {
  TempDir d;
  put(d / "data.jsonl", "{}\n");
  fs::create_directories(d / "model");
  {
    IoSet io;
    io.input("the data file of phase grpo", d / "data.jsonl");
    io.outputFile("--metrics", d.path + "/./data.jsonl");
    EXPECT_EQ(io.check(), "--metrics '" + d.path + "/./data.jsonl' is the data file of phase "
                          "grpo (an input): hflow never writes over what it reads; choose "
                          "another path");
  }
  {
    // A hard link is the same file under another name.
    fs::create_hard_link(d / "data.jsonl", d / "alias.jsonl");
    IoSet io;
    io.input("the plan", d / "data.jsonl");
    io.outputFile("--report", d / "alias.jsonl");
    EXPECT_NE(io.check().find("is the plan (an input)"), std::string::npos);
  }
  {
    IoSet io;
    io.outputFile("--report", d / "r.html");
    io.outputFile("--trace", d / "r.html");
    EXPECT_EQ(io.check(), "--report '" + d / "r.html" + "' and --trace '" + d / "r.html" +
                              "' name the same file: each output needs its own");
  }
  {
    IoSet io;
    io.outputFolder("--checkpoint-dir", d / "ck");
    io.outputFile("--metrics", d / "ck/m.jsonl");
    EXPECT_EQ(io.check(), "--metrics '" + d / "ck/m.jsonl" + "' lies inside --checkpoint-dir '" +
                              d / "ck" + "', which hflow fills itself: choose a path outside it");
  }
  {
    IoSet io;
    io.inputFolder("the weights of model tiny", d / "model");
    io.outputFolder("--export-hf", d / "model");
    EXPECT_NE(io.check().find("is the weights of model tiny (an input)"), std::string::npos);
    IoSet io2;
    io2.inputFolder("the weights of model tiny", d / "model");
    io2.outputFolder("--export-hf", d / "model/out");
    EXPECT_NE(io2.check().find("lies inside the weights of model tiny"), std::string::npos);
  }
  {
    IoSet ok;
    ok.input("the plan", d / "p.bin");
    ok.outputFile("--metrics", d / "m.jsonl");
    ok.outputFolder("--checkpoint-dir", d / "ck");
    ok.outputFile("", "");
    EXPECT_EQ(ok.check(), "");
  }
}

TEST(OutputFiles, LocksNameTheJobHoldingThem) {
  TempDir d;
  const std::string lf = lockFileFor(d / "m.jsonl");
  EXPECT_EQ(lf, d / ".m.jsonl.hflow-lock");
  JobLock a;
  ASSERT_EQ(a.acquire(lf, "pid 1 on host, since then: hflow-run first.bin"), "");
  // flock locks are per open file: a second open in this process conflicts
  // like another job would.
  JobLock b;
  EXPECT_EQ(b.acquire(lf, "pid 2"), "is in use by another job (pid 1 on host, since then: "
                                    "hflow-run first.bin); wait for it to finish or choose "
                                    "another path");
  a.release();
  EXPECT_FALSE(fs::exists(lf));
  EXPECT_EQ(b.acquire(lf, "pid 2"), "");
  EXPECT_EQ(slurp(lf), "pid 2\n");
  const std::string me = describeThisJob("");
  EXPECT_EQ(me.rfind("pid " + std::to_string(::getpid()) + " on ", 0), 0u) << me;
  EXPECT_NE(me.find("hflow-runtime-tests"), std::string::npos) << me;
}

TEST(OutputFiles, FoldersHoldOnlyWhatHflowWrote) {
  TempDir d;
  const FolderKind ck = exec::RunOutputs::checkpointKind();
  const std::string dir = d / "ck";
  JobLock lock;
  // Absent: created and marked.
  ASSERT_EQ(claimFolder(dir, ck, FolderMode::Fresh, "hflow-run", "job 1", lock), "");
  EXPECT_TRUE(fs::exists(dir + "/" + kMarkerFile));
  EXPECT_EQ(slurp(dir + "/" + kFolderLock), "job 1\n");
  // A second job is refused while the first holds it.
  JobLock other;
  EXPECT_EQ(claimFolder(dir, ck, FolderMode::Reuse, "hflow-run", "job 2", other),
            "--checkpoint-dir '" + dir + "' is in use by another job (job 1); wait for it to "
            "finish or choose another path");
  // The run wrote checkpoints; the next fresh run is refused, --resume
  // reuses them, --overwrite removes only what hflow wrote.
  fs::create_directories(dir + "/rank-0/step-000004");
  put(dir + "/latest", "4\n");
  lock.release();
  EXPECT_EQ(claimFolder(dir, ck, FolderMode::Fresh, "hflow-run", "job 2", other),
            "--checkpoint-dir '" + dir + "' holds an earlier run's files (latest, rank-0): "
            "continue that run with --resume, or replace them with --overwrite, or choose "
            "another folder");
  EXPECT_FALSE(other.held());
  EXPECT_EQ(claimFolder(dir, ck, FolderMode::Reuse, "hflow-run", "job 2", other), "");
  other.release();
  put(dir + "/notes.txt", "mine");
  EXPECT_EQ(claimFolder(dir, ck, FolderMode::Overwrite, "hflow-run", "job 3", other),
            "--checkpoint-dir '" + dir + "' holds files hflow did not write there (notes.txt): "
            "hflow fills only an empty folder or one it filled itself, and --overwrite removes "
            "only what hflow wrote; choose another folder, or move them");
  EXPECT_TRUE(fs::exists(dir + "/latest")); // nothing removed
  fs::remove(dir + "/notes.txt");
  EXPECT_EQ(claimFolder(dir, ck, FolderMode::Overwrite, "hflow-run", "job 3", other), "");
  EXPECT_EQ(names(dir), (std::vector<std::string>{kFolderLock, kMarkerFile}));
  other.release();

  // A folder someone else filled, even with names an export uses, is never
  // hflow's (no marker): refused, naming what is there.
  const std::string model = d / "model";
  fs::create_directories(model);
  put(model + "/config.json", "{}");
  put(model + "/model.safetensors", "weights");
  put(model + "/tokenizer.json", "{}");
  const FolderKind ex = exec::RunOutputs::exportKind();
  EXPECT_EQ(claimFolder(model, ex, FolderMode::Overwrite, "hflow-run", "job 4", other),
            "--export-hf '" + model + "' holds files hflow did not write (config.json, "
            "model.safetensors, tokenizer.json): hflow fills only an empty folder or one it "
            "filled itself; choose another folder, or empty this one");
  EXPECT_EQ(slurp(model + "/model.safetensors"), "weights");
  // A folder hflow filled as something else.
  EXPECT_EQ(claimFolder(dir, ex, FolderMode::Fresh, "hflow-run", "job 4", other),
            "--export-hf '" + dir + "' holds what hflow wrote as checkpoint-dir, not as "
            "export-hf: choose another folder");
  // A file where a folder should be.
  put(d / "afile", "x");
  EXPECT_EQ(claimFolder(d / "afile", ck, FolderMode::Fresh, "hflow-run", "job 4", other),
            "--checkpoint-dir '" + d / "afile" + "' exists and is not a folder");
}

TEST(RunOutputs, AResumeKeepsTheRowsBeforeItsPoint) {
  exec::ResumePoint at;
  at.phases = {"warmup", "grpo"};
  at.phase = 1;
  at.iteration = 2;
  const std::string rows = "{\"phase\": \"start\", \"iteration\": 0}\n"
                           "{\"phase\": \"warmup\", \"iteration\": 1}\n"
                           "{\"phase\": \"warmup\", \"iteration\": 2}\n"
                           "{\"phase\": \"grpo\", \"iteration\": 1}\n"
                           "{\"phase\": \"grpo\", \"iteration\": 2}\n"
                           "{\"phase\": \"grpo\", \"iteration\": 3}\n"
                           "{\"phase\": \"grpo\", \"iteration\": 4}\n";
  std::string why;
  auto kept = exec::RunOutputs::rowsBefore(rows, at, why);
  ASSERT_EQ(kept.size(), 5u);
  EXPECT_EQ(kept.back(), "{\"phase\": \"grpo\", \"iteration\": 2}\n");
  EXPECT_EQ(why, "");
  // The same flow twice in a row: its iterations start again at 1.
  exec::ResumePoint twice;
  twice.phases = {"sft", "sft"};
  twice.phase = 1;
  twice.iteration = 1;
  kept = exec::RunOutputs::rowsBefore("{\"phase\": \"sft\", \"iteration\": 1}\n"
                                      "{\"phase\": \"sft\", \"iteration\": 2}\n"
                                      "{\"phase\": \"sft\", \"iteration\": 1}\n"
                                      "{\"phase\": \"sft\", \"iteration\": 2}\n",
                                      twice, why);
  EXPECT_EQ(kept.size(), 3u);
  EXPECT_EQ(why, "");
  // Rows that stop early (the crash came before the checkpoint's rows were
  // all written) are kept, and the warning says where they stop.
  kept = exec::RunOutputs::rowsBefore("{\"phase\": \"warmup\", \"iteration\": 1}\n", at, why);
  EXPECT_EQ(kept.size(), 1u);
  EXPECT_EQ(why, "its rows stop at warmup 1");
  kept = exec::RunOutputs::rowsBefore("{\"phase\": \"warmup\", \"iteration\": 1}\nnot json\n",
                                      at, why);
  EXPECT_EQ(kept.size(), 1u);
  EXPECT_EQ(why, "its line 2 is not a metrics row");
  kept = exec::RunOutputs::rowsBefore("{\"phase\": \"other\", \"iteration\": 1}\n", at, why);
  EXPECT_EQ(kept.size(), 0u);
  EXPECT_EQ(why, "its line 1 is of phase 'other', which this run does not have there");
}
