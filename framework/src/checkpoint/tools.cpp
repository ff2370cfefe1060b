#include "checkpoint/tools.h"

#include <chrono>
#include <cstdio>

#include "checkpoint/reader.h"
#include "checkpoint/weights.h"
#include "config/config.h"
#include "config/section_options.h"
#include "ztrain/error.h"
#include "ztrain/units.h"

namespace ztrain {
namespace fs = std::filesystem;

namespace {

// The model the checkpoint's run trained, from its recorded configuration.
std::shared_ptr<Model> model_of(const Checkpoint& c, const PluginLoader& loader) {
  const RunConfig config =
      RunConfig::parse(c.manifest().config_toml, (c.dir() / "manifest.json").string());
  const LoadedPlugin lib = loader.load("model", config.plugin("model", "transformer"));
  auto model = lib.create<Model>(plugin_options(config, "model", lib, model_host_options()));
  c.check_model(model->params());
  return model;
}

}  // namespace

bool is_checkpoint(const fs::path& path) {
  return fs::exists(path / "manifest.json") || fs::exists(path / "latest");
}

bool checkpoint_info(const fs::path& path, const PluginLoader& loader, std::ostream& os) {
  const Checkpoint c = Checkpoint::open(path);
  const Manifest& m = c.manifest();
  std::uint64_t elements = 0, bytes = 0;
  std::size_t pieces = 0;
  for (const auto& p : m.params) {
    elements += p.numel();
    pieces += p.pieces.size();
  }
  for (const auto& f : m.files) bytes += f.bytes;
  const auto model = model_of(c, loader);
  os << "checkpoint " << c.dir().string() << "\n"
     << "  step        " << m.position.step << " (" << m.position.applied << " applied, "
     << m.position.skipped << " skipped)\n"
     << "  written by  ztrain " << m.ztrain_version << ", world " << m.world << ", strategy "
     << m.strategy << ", precision " << m.precision << "\n"
     << "  model       " << model->info().arch << ", " << m.params.size() << " tensors, "
     << elements << " parameters\n"
     << "  batch       " << m.global_batch << " sequences per step; "
     << m.global_batch * m.position.step << " read\n"
     << "  loss scale  " << m.position.scaler.scale << "\n"
     << "  state       fp32 master, m, v: " << pieces << " pieces in " << m.files.size()
     << " rank file" << (m.files.size() == 1 ? "" : "s") << ", " << format_bytes(bytes) << "\n";
  const auto t0 = std::chrono::steady_clock::now();
  try {
    const std::uint64_t read = c.verify();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char line[160];
    std::snprintf(line, sizeof line, "  checksums   all verified (%s read in %.2f s)\n",
                  format_bytes(read).c_str(), s);
    os << line;
    return true;
  } catch (const DataError& e) {
    os << "  checksums   FAILED: " << e.what() << "\n";
    return false;
  }
}

fs::path export_checkpoint(const fs::path& path, const fs::path& out, DType dtype, bool overwrite,
                           const PluginLoader& loader) {
  const Checkpoint c = Checkpoint::open(path);
  check_export_target(out, overwrite);
  const auto model = model_of(c, loader);
  CheckpointSource source(c);
  const auto params = model->params();
  write_weights(*model, out, dtype, [&](ParamId p, float* values) {
    source.get(p, 0, static_cast<std::uint64_t>(params[p].shape.numel()), StateArray::master,
               values);
  });
  return c.dir();
}

}  // namespace ztrain
