//===- Imports.cpp - load the files a program imports ----------------------===//

#include "compiler/frontend/Imports.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace fs = std::filesystem;
using namespace hflow;
using namespace hflow::frontend;

namespace {

class Loader {
public:
  Loader(const FrontendOptions &o, FrontendResult &r) : opts_(o), result_(r) {}

  void run(ast::Program &main) {
    std::string root = canonical(main.file);
    loaded_.insert(root);
    // Imports of imported files are appended to main.imports as they are
    // merged, so this loop also visits them; each knows its own depth.
    std::vector<size_t> depth(main.imports.size(), 1);
    std::vector<std::vector<std::string>> chain(main.imports.size(), {root});
    for (size_t i = 0; i < main.imports.size(); ++i) {
      ast::ImportDecl &imp = main.imports[i];
      if (depth[i] > static_cast<size_t>(opts_.maxImportDepth)) {
        result_.diags.error(imp.loc, "imports are nested deeper than " +
                                         std::to_string(opts_.maxImportDepth) +
                                         " levels");
        continue;
      }
      std::string path = resolve(imp);
      if (path.empty())
        continue;
      imp.resolved = path;
      const std::vector<std::string> &via = chain[i];
      if (std::find(via.begin(), via.end(), path) != via.end()) {
        std::string cycle;
        bool in = false;
        for (const std::string &f : via) {
          in |= f == path;
          if (in)
            cycle += fs::path(f).filename().string() + " -> ";
        }
        cycle += fs::path(path).filename().string();
        result_.diags.error(imp.loc, "import cycle: " + cycle);
        continue;
      }
      if (!loaded_.insert(path).second)
        continue; // already loaded through another import
      constexpr std::uintmax_t kMaxImportBytes = 64u << 20;
      std::error_code sizeError;
      if (fs::file_size(path, sizeError) > kMaxImportBytes && !sizeError) {
        result_.diags.error(imp.loc, "imported file '" + path +
                                         "' is larger than 64 MiB");
        continue;
      }
      std::ifstream in(path, std::ios::binary);
      std::stringstream ss;
      ss << in.rdbuf();
      if (!in.good() && !in.eof()) {
        result_.diags.error(imp.loc, "cannot read imported file '" + path + "'");
        continue;
      }
      std::string text = ss.str();
      FrontendResult sub = parseOnly(path, text);
      result_.imported.push_back({path, text});
      for (const Diagnostic &d : sub.diags.all())
        result_.diags.add(d);
      if (!sub.program || sub.diags.hasErrors()) {
        result_.diags.error(imp.loc, "in the file imported here");
        continue;
      }
      ast::Program &p = *sub.program;
      std::vector<std::string> subChain = via;
      subChain.push_back(path);
      for (ast::ImportDecl &nested : p.imports) {
        main.imports.push_back(std::move(nested));
        depth.push_back(depth[i] + 1);
        chain.push_back(subChain);
      }
      auto append = [](auto &to, auto &from) {
        for (auto &x : from)
          to.push_back(std::move(x));
      };
      append(main.devices, p.devices);
      append(main.clusters, p.clusters);
      append(main.models, p.models);
      append(main.roles, p.roles);
      append(main.places, p.places);
      append(main.flows, p.flows);
      append(main.trains, p.trains);
    }
  }

private:
  static std::string canonical(const std::string &p) {
    std::error_code ec;
    fs::path c = fs::weakly_canonical(fs::absolute(p, ec), ec);
    return ec ? p : c.string();
  }

  /// The file an import names, or "" after reporting why there is none.
  std::string resolve(const ast::ImportDecl &imp) {
    fs::path rel(imp.path);
    if (imp.path.empty()) {
      result_.diags.error(imp.loc, "empty import path");
      return "";
    }
    if (!rel.has_extension())
      rel += ".hflow";
    std::vector<fs::path> candidates;
    const std::string stdPrefix = "std/";
    if (imp.path.rfind(stdPrefix, 0) == 0) {
      if (opts_.stdlibDir.empty()) {
        result_.diags.error(imp.loc, "the standard library is not available; "
                                     "pass --stdlib DIR");
        return "";
      }
      candidates.push_back(fs::path(opts_.stdlibDir) /
                           rel.string().substr(stdPrefix.size()));
    } else if (rel.is_absolute()) {
      candidates.push_back(rel);
    } else {
      candidates.push_back(fs::path(imp.loc.file).parent_path() / rel);
      for (const std::string &dir : opts_.includeDirs)
        candidates.push_back(fs::path(dir) / rel);
    }
    for (const fs::path &c : candidates) {
      std::error_code ec;
      if (fs::is_regular_file(c, ec))
        return canonical(c.string());
    }
    Diagnostic &d = result_.diags.error(
        imp.loc, "cannot find imported file '" + imp.path + "'");
    std::string tried;
    for (const fs::path &c : candidates)
      tried += (tried.empty() ? "" : ", ") + c.string();
    d.notes.push_back({imp.loc, "looked for: " + tried});
    return "";
  }

  const FrontendOptions &opts_;
  FrontendResult &result_;
  std::set<std::string> loaded_;
};

} // namespace

void hflow::frontend::loadImports(ast::Program &program,
                                  const FrontendOptions &options,
                                  FrontendResult &result) {
  Loader(options, result).run(program);
}
