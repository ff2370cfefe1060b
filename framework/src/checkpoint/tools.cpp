#include "checkpoint/tools.h"

#include <chrono>
#include <cstdio>
#include <optional>

#include "checkpoint/reader.h"
#include "checkpoint/weights.h"
#include "checkpoint/weights_import.h"
#include "config/config.h"
#include "config/section_options.h"
#include "ztrain/error.h"
#include "ztrain/shard/init.h"
#include "ztrain/units.h"

namespace ztrain {
namespace fs = std::filesystem;

namespace {

// The model the checkpoint's run trained, from its recorded configuration,
// and its options.
struct CheckpointModel {
  std::shared_ptr<Model> model;
  Options options;
};

CheckpointModel model_of(const Checkpoint& c, const PluginLoader& loader) {
  const RunConfig config =
      RunConfig::parse(c.manifest().config_toml, (c.dir() / "manifest.json").string());
  const LoadedPlugin lib = loader.load("model", config.plugin("model", "transformer"));
  CheckpointModel m{nullptr, plugin_options(config, "model", lib, model_host_options())};
  m.model = lib.create<Model>(m.options);
  c.check_model(m.model->params());
  return m;
}

// A checkpoint's master values; its frozen parameters (which it does not
// hold) from where the run took them: [model] init_from, or the seed.
class ExportSource {
 public:
  ExportSource(const Checkpoint& c, const CheckpointModel& m)
      : checkpoint_(c), params_(m.model->params()), seed_(c.manifest().seed) {
    if (!has_frozen(params_) || !m.options.has_value("init_from")) return;
    base_file_.emplace(SafetensorsSet::weights_at(m.options.get_string("init_from")));
    base_.emplace(*base_file_, *m.model, seed_);
  }
  void read(ParamId p, float* out) {
    const auto n = static_cast<std::uint64_t>(params_[p].shape.numel());
    if (params_[p].trainable) return checkpoint_.get(p, 0, n, StateArray::master, out);
    if (base_) return base_->get(p, 0, n, StateArray::master, out);
    shard::initial_values(params_[p], index_of(p), seed_, 0, n, out);
  }

 private:
  CheckpointSource checkpoint_;
  ParamSpecs params_;
  std::uint64_t seed_;
  std::optional<SafetensorsSet> base_file_;
  std::optional<WeightsFile> base_;
};

}  // namespace

bool is_checkpoint(const fs::path& path) {
  return fs::exists(path / "manifest.json") || fs::exists(path / "latest");
}

bool checkpoint_info(const fs::path& path, const PluginLoader& loader, std::ostream& os) {
  const Checkpoint c = Checkpoint::open(path);
  const Manifest& m = c.manifest();
  std::uint64_t elements = 0, bytes = 0, frozen_elements = 0;
  std::size_t pieces = 0, frozen = 0;
  for (const auto& p : m.params) {
    elements += p.numel();
    pieces += p.pieces.size();
    if (p.frozen) {
      ++frozen;
      frozen_elements += p.numel();
    }
  }
  for (const auto& f : m.files) bytes += f.bytes;
  const auto model = model_of(c, loader).model;
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
  if (frozen > 0)
    os << "  frozen      " << frozen << " tensors, " << frozen_elements
       << " parameters, not stored: a resume reads them from [model] init_from again (or the "
          "seed)\n";
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
  const CheckpointModel m = model_of(c, loader);
  ExportSource source(c, m);
  write_weights(*m.model, m.model->params(), out, dtype,
                [&](ParamId p, float* values) { source.read(p, values); });
  return c.dir();
}

}  // namespace ztrain
