#include "train/weights.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>

#include "core/safetensors.h"
#include "train/rank_agreement.h"
#include "ztrain/error.h"
#include "ztrain/version.h"

namespace ztrain {
namespace fs = std::filesystem;

namespace {

// (rows, cols) row-major -> (cols, rows)
void transpose(const float* in, float* out, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

std::string external_name(const ParamSpec& p) {
  return p.hf_name.empty() ? p.name : p.hf_name;
}

Shape external_shape(const ParamSpec& p) {
  if (!p.hf_transposed) return p.shape;
  return Shape{p.shape[1], p.shape[0]};
}

// Where the tensors of an export to `out` go: `out` itself when it names a
// .safetensors file, else out/model.safetensors, with `config_json` (when
// non-empty) written beside it.
fs::path prepare_target(const fs::path& out, const std::string& config_json) {
  if (out.extension() == ".safetensors") return out;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw DataError("cannot create export directory '" + out.string() + "': " + ec.message());
  if (!config_json.empty()) {
    std::ofstream cfg(out / "config.json");
    cfg << config_json;
    if (!cfg) throw DataError("cannot write '" + (out / "config.json").string() + "'");
  }
  return out / "model.safetensors";
}

}  // namespace

void write_weights(const Model& model, const fs::path& out, DType dtype, const ReadParam& read) {
  const auto params = model.params();
  std::vector<SafetensorsTensor> tensors;
  for (const ParamSpec& p : params) tensors.push_back({external_name(p), dtype, external_shape(p)});
  SafetensorsWriter writer(prepare_target(out, model.hf_config_json()), tensors,
                           {{"format", "pt"},
                            {"producer", std::string("ztrain ") + ZTRAIN_VERSION},
                            {"arch", model.info().arch}});
  std::vector<float> full, flipped;
  std::vector<std::uint8_t> bytes;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    full.resize(static_cast<std::size_t>(p.shape.numel()));
    read(static_cast<ParamId>(i), full.data());
    const float* src = full.data();
    if (p.hf_transposed) {
      flipped.resize(full.size());
      transpose(full.data(), flipped.data(), p.shape[0], p.shape[1]);
      src = flipped.data();
    }
    bytes.resize(full.size() * dtype_size(dtype));
    convert(src, DType::f32, bytes.data(), dtype, full.size());
    writer.put(bytes.data());
  }
  writer.finish();
}

void export_weights(const Model& model, Strategy& strategy, const fs::path& out, DType dtype,
                    bool write) {
  if (write)
    return write_weights(model, out, dtype,
                         [&](ParamId p, float* values) { strategy.read_param(p, values); });
  std::vector<float> full;
  const auto params = model.params();
  for (std::size_t i = 0; i < params.size(); ++i) {
    full.resize(static_cast<std::size_t>(params[i].shape.numel()));
    strategy.read_param(static_cast<ParamId>(i), full.data());
  }
}

namespace {

// The file's tensor for every parameter of `model`, matched by its Hugging
// Face name (else its own) and shape; DataError listing every difference.
std::vector<const SafetensorsEntry*> match_params(const SafetensorsReader& file,
                                                  const Model& model) {
  const auto params = model.params();
  std::vector<std::string> missing, unexpected, misshaped;
  std::vector<bool> used(file.entries().size(), false);
  std::vector<const SafetensorsEntry*> match(params.size(), nullptr);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const ParamSpec& p = params[i];
    const SafetensorsEntry* e = file.find(external_name(p));
    if (!e) e = file.find(p.name);
    if (!e) {
      missing.push_back(external_name(p) + " " + external_shape(p).str());
      continue;
    }
    used[static_cast<std::size_t>(e - file.entries().data())] = true;
    if (e->shape != external_shape(p)) {
      misshaped.push_back(e->name + ": shape " + e->shape.str() + " in the file, " +
                          external_shape(p).str() + " expected" +
                          (p.hf_transposed ? " (Hugging Face Conv1D layout: in, out)" : ""));
      continue;
    }
    match[i] = e;
  }
  for (std::size_t j = 0; j < file.entries().size(); ++j)
    if (!used[j] && !model.ignorable_tensor(file.entries()[j].name))
      unexpected.push_back(file.entries()[j].name + " " + file.entries()[j].shape.str());
  const std::size_t differences = missing.size() + unexpected.size() + misshaped.size();
  if (differences > 0) {
    std::string list;
    auto section = [&](const char* title, const std::vector<std::string>& items) {
      if (items.empty()) return;
      list += "\n  " + std::to_string(items.size()) + " " + title + ":";
      const std::size_t shown = std::min<std::size_t>(items.size(), 8);
      for (std::size_t i = 0; i < shown; ++i) list += "\n    " + items[i];
      if (shown < items.size())
        list += "\n    ... and " + std::to_string(items.size() - shown) + " more";
    };
    section("missing from the file", missing);
    section("unexpected in the file", unexpected);
    section("with another shape", misshaped);
    throw DataError(file.path().string() + ": does not match the " + model.info().arch +
                    " model of this run (" + std::to_string(differences) + " differences):" + list +
                    "\ncheck [model] arch, n_layer, n_embd, n_head, vocab_size and seq_len");
  }
  return match;
}

// Parameter `p` from its tensor, in the model's layout (fp32; Hugging Face
// Conv1D weights transposed back).
void read_param(const SafetensorsReader& file, const SafetensorsEntry& e, const ParamSpec& p,
                std::vector<float>& values, std::vector<float>& scratch) {
  values.resize(static_cast<std::size_t>(p.shape.numel()));
  file.read_f32(e, values.data());
  if (!p.hf_transposed) return;
  scratch.resize(values.size());
  transpose(values.data(), scratch.data(), p.shape[1], p.shape[0]);
  values.swap(scratch);
}

// Broadcasts are cut to this many elements, so a rank never holds more of
// the file than its largest parameter (and the communicator's buffers stay
// small).
constexpr std::size_t kPieceElements = std::size_t{16} << 20;

}  // namespace

WeightsImport import_weights(const Model& model, Strategy& strategy, const fs::path& in,
                             Communicator& comm) {
  const fs::path path = fs::is_directory(in) ? in / "model.safetensors" : in;
  const bool seen = fs::exists(path);
  const auto params = model.params();
  std::vector<float> values, scratch;
  if (!any_rank(!seen, comm) || comm.size() == 1) {  // every rank reads the file itself
    if (!seen)
      throw DataError("init_from: no weights at '" + path.string() +
                      "'; give a .safetensors file or a directory holding model.safetensors");
    check_files_agree("init_from", {path.string()}, comm);  // no host's copy is stale
    const SafetensorsReader file(path);
    const auto match = match_params(file, model);
    for (std::size_t i = 0; i < params.size(); ++i) {
      read_param(file, *match[i], params[i], values, scratch);
      strategy.write_param(static_cast<ParamId>(i), values.data());
    }
    return {};
  }
  // Some rank cannot see the file: rank 0 reads it and sends each
  // parameter to the others.
  const auto t0 = std::chrono::steady_clock::now();
  const CommCounters mark = comm.counters();
  std::string why;
  std::optional<SafetensorsReader> file;
  std::vector<const SafetensorsEntry*> match;
  if (comm.rank() == 0) {
    try {
      if (!seen)
        throw DataError("init_from: no weights at '" + path.string() + "' on rank 0 (host " +
                        host_name() +
                        "), which reads them for the ranks that cannot; give a .safetensors file "
                        "or a directory holding model.safetensors");
      file.emplace(path);
      match = match_params(*file, model);
    } catch (const DataError& e) {
      why = e.what();
    }
  }
  stop_together<DataError>(why, "init_from: rank 0 cannot read the weights (its error is above)",
                           comm);
  for (std::size_t i = 0; i < params.size(); ++i) {
    if (file) read_param(*file, *match[i], params[i], values, scratch);
    values.resize(static_cast<std::size_t>(params[i].shape.numel()));
    for (std::size_t at = 0; at < values.size(); at += kPieceElements)
      comm.broadcast(values.data() + at, std::min(kPieceElements, values.size() - at), DType::f32,
                     0);
    strategy.write_param(static_cast<ParamId>(i), values.data());
  }
  // Every rank's bytes sent (a broadcast may relay), summed over the ranks.
  float moved = static_cast<float>(comm.counters().since(mark).total_bytes());
  comm.all_reduce(&moved, 1, DType::f32, ReduceOp::sum);
  return {true, static_cast<std::uint64_t>(moved),
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()};
}

void check_export_target(const fs::path& out, bool overwrite, const fs::path& source) {
  const fs::path landing = out.extension() == ".safetensors" ? out : out / "model.safetensors";
  std::error_code ec;
  if (!source.empty() && fs::exists(landing) && fs::equivalent(landing, source, ec))
    throw ConfigError("export: '" + landing.string() +
                      "' is the source itself; writing there would replace the weights being "
                      "read; choose another OUT");
  if (fs::exists(landing) && !overwrite)
    throw ConfigError("export: '" + landing.string() +
                      "' exists; choose another OUT, or pass --overwrite to replace it");
}

void convert_weights(const fs::path& source, const fs::path& out, DType dtype, bool overwrite) {
  const bool dir = fs::is_directory(source);
  const fs::path file = dir ? source / "model.safetensors" : source;
  if (!fs::exists(file))
    throw DataError("no weights at '" + file.string() + "'" +
                    (dir ? "; is this a ztrain run directory of a finished run?" : ""));
  // Where the weights would land, checked before anything is written.
  check_export_target(out, overwrite, file);
  const SafetensorsReader in(file);
  std::string config_json;
  if (dir && fs::exists(source / "config.json")) {
    std::ifstream cfg(source / "config.json");
    config_json.assign(std::istreambuf_iterator<char>(cfg), {});
  }
  const fs::path target = prepare_target(out, config_json);
  std::vector<std::vector<std::uint8_t>> storage;
  std::vector<SafetensorsTensor> tensors;
  std::vector<float> values;
  for (const auto& e : in.entries()) {
    values.resize(static_cast<std::size_t>(e.shape.numel()));
    in.read_f32(e, values.data());
    storage.emplace_back(values.size() * dtype_size(dtype));
    convert(values.data(), DType::f32, storage.back().data(), dtype, values.size());
    tensors.push_back({e.name, dtype, e.shape, storage.back().data()});
  }
  auto meta = in.metadata();
  meta["format"] = "pt";
  write_safetensors(target, tensors, meta);
}

}  // namespace ztrain
