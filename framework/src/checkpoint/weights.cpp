#include "checkpoint/weights.h"

#include <algorithm>
#include <fstream>
#include <map>

#include "checkpoint/hf_export.h"
#include "io/durable_file.h"
#include "io/safetensors.h"
#include "kernels/cpu/blas.h"
#include "text/tokenizer.h"
#include "ztrain/error.h"
#include "ztrain/pipeline/stage_partition.h"
#include "ztrain/version.h"

namespace ztrain {
namespace fs = std::filesystem;

std::string external_name(const ParamSpec& p) {
  return p.hf_name.empty() ? p.name : p.hf_name;
}

Shape external_shape(const ParamSpec& p) {
  if (!p.hf_transposed) return p.shape;
  return Shape{p.shape[1], p.shape[0]};
}

namespace {

// (rows, cols) row-major -> (cols, rows)
void transpose(const float* in, float* out, std::int64_t rows, std::int64_t cols) {
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c) out[c * rows + r] = in[r * cols + c];
}

// Where the tensors of an export to `out` go: `out` itself when it names a
// .safetensors file, else out/model.safetensors, with `config_json` (when
// non-empty; its torch_dtype and token ids set, checkpoint/hf_export.h) and
// the tokenizer and chat template (when known) beside it.
fs::path prepare_target(const fs::path& out, const std::string& config_json, DType dtype,
                        const TextFiles& text) {
  if (out.extension() == ".safetensors") return out;
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw DataError("cannot create export directory '" + out.string() + "': " + ec.message());
  if (!config_json.empty())
    write_file_atomically(out / "config.json",
                          export_config_json(config_json, dtype, text.tokenizer));
  copy_text_files(text, out);
  return out / "model.safetensors";
}

// The LoRA adapters of a model: their values, read before the weights
// they merge into (one adapter is small beside its weight), merged as the
// model computes them, W + scale * B A, and PEFT's adapter directory.
class AdapterValues {
 public:
  AdapterValues(const Model& model, const ParamSpecs& params)
      : model_(model), params_(whole_specs(params)), list_(model.adapters()) {}
  bool empty() const { return list_.empty(); }
  float* values(ParamId p) {
    std::vector<float>& v = values_[p];
    v.resize(static_cast<std::size_t>(params_[p].shape.numel()));
    return v.data();
  }
  // w (out, in) += scale * B (out, r) A (r, in) for each adapter of `weight`.
  void merge_into(ParamId weight, float* w) const {
    for (const AdapterOf& a : list_) {
      if (a.weight != weight) continue;
      const Shape& shape = params_[weight].shape;
      const auto out = static_cast<std::size_t>(shape[0]), in = static_cast<std::size_t>(shape[1]),
                 r = static_cast<std::size_t>(params_[a.a].shape[0]);
      blas::sgemm(blas::Op::none, blas::Op::none, out, in, r, a.scale, values_.at(a.b).data(), r,
                  values_.at(a.a).data(), in, 1.0f, w, in);
    }
  }
  // dir/adapter_model.safetensors under PEFT's names, and adapter_config.json.
  void write_peft(const fs::path& dir, DType dtype) const {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec)
      throw DataError("cannot create adapter directory '" + dir.string() + "': " + ec.message());
    std::vector<SafetensorsTensor> tensors;
    for (const auto& [p, v] : values_)
      tensors.push_back({"base_model.model." + external_name(params_[p]), dtype, params_[p].shape});
    SafetensorsWriter writer(dir / "adapter_model.safetensors", tensors, {{"format", "pt"}});
    std::vector<std::uint8_t> bytes;
    for (const auto& [p, v] : values_) {
      bytes.resize(v.size() * dtype_size(dtype));
      convert(v.data(), DType::f32, bytes.data(), dtype, v.size());
      writer.put(bytes.data());
    }
    writer.finish();
    write_file_atomically(dir / "adapter_config.json", model_.adapter_config_json());
  }

 private:
  const Model& model_;
  ParamSpecs params_;
  std::vector<AdapterOf> list_;
  std::map<ParamId, std::vector<float>> values_;  // in id order, as the file lists them
};

}  // namespace

std::string TensorDifferences::listed() const {
  std::string list;
  const auto section = [&](const char* title, const std::vector<std::string>& items) {
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
  return list;
}

std::vector<ParamId> export_order(const ParamSpecs& params) {
  std::vector<ParamId> order;
  for (bool adapters : {true, false})
    for (ParamId id : params.ids())
      if (params[id].adapter == adapters) order.push_back(id);
  return order;
}

ParamSpec whole_spec(const ParamSpec& part) {
  if (part.split.dim < 0) return part;
  ParamSpec whole = part;
  std::vector<std::int64_t> dims = part.shape.dims();
  std::int64_t& along = dims[static_cast<std::size_t>(part.split.dim)];
  along = part.split.whole_extent(along);
  whole.shape = Shape(std::move(dims));
  whole.split = {};
  return whole;
}

ParamSpecs whole_specs(const ParamSpecs& params) {
  ParamSpecs whole = params;
  for (ParamSpec& p : whole) p = whole_spec(p);
  return whole;
}

void write_weights(const Model& model, const ParamSpecs& listed, const fs::path& out, DType dtype,
                   const ReadParam& read, const TextFiles& text) {
  const ParamSpecs params = whole_specs(listed);
  const auto order = export_order(params);
  AdapterValues adapters(model, listed);
  for (ParamId id : order)
    if (params[id].adapter) read(id, adapters.values(id));
  std::vector<SafetensorsTensor> tensors;
  for (const ParamSpec& p : params)
    if (!p.adapter) tensors.push_back({external_name(p), dtype, external_shape(p)});
  const fs::path target = prepare_target(out, model.hf_config_json(), dtype, text);
  SafetensorsWriter writer(target, tensors,
                           {{"format", "pt"},
                            {"producer", std::string("ztrain ") + ZTRAIN_VERSION},
                            {"arch", model.info().arch}});
  std::vector<float> full, flipped;
  std::vector<std::uint8_t> bytes;
  for (ParamId id : order) {
    const ParamSpec& p = params[id];
    if (p.adapter) continue;
    full.resize(static_cast<std::size_t>(p.shape.numel()));
    read(id, full.data());
    adapters.merge_into(id, full.data());
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
  if (!adapters.empty() && out.extension() != ".safetensors")
    adapters.write_peft(out / "adapter", dtype);
}

namespace {

// Reads parameters whole: a part's values gathered from every rank of the
// tensor group (collective over it), each placed where the whole holds it.
// Parts of unequal rows travel in slots of the largest part's size.
class WholeReader {
 public:
  WholeReader(const ParamSpecs& params, Strategy& strategy, Communicator* tensor_group)
      : params_(params), strategy_(strategy), group_(tensor_group) {}
  void operator()(ParamId id, float* whole) {
    const ParamSpec& p = params_[id];
    if (!group_ || p.split.dim < 0) return strategy_.read_param(id, whole);
    const std::size_t slot = slot_size(p);
    part_.assign(slot, 0.0f);
    gathered_.resize(slot * static_cast<std::size_t>(group_->size()));
    strategy_.read_param(id, part_.data());
    group_->all_gather(part_.data(), gathered_.data(), slot, DType::f32);
    for (int t = 0; t < group_->size(); ++t) {
      TensorSplit split = p.split;
      split.part = t / split.copies;  // copies of one part land on the same place
      const Shape shape = part_shape(p, split.part);
      const float* from = gathered_.data() + static_cast<std::size_t>(t) * slot;
      for (std::size_t i = 0; i < static_cast<std::size_t>(shape.numel()); ++i)
        whole[split.whole_index(shape, i)] = from[i];
    }
  }

 private:
  // Part `part`'s shape: p's, with its own rows where parts differ.
  static Shape part_shape(const ParamSpec& p, int part) {
    if (p.split.whole == 0) return p.shape;
    std::vector<std::int64_t> dims = p.shape.dims();
    dims[0] = p.split.first_row(part + 1) - p.split.first_row(part);
    return Shape(std::move(dims));
  }
  static std::size_t slot_size(const ParamSpec& p) {
    std::size_t most = 0;
    for (int part = 0; part < p.split.parts; ++part)
      most = std::max(most, static_cast<std::size_t>(part_shape(p, part).numel()));
    return most;
  }

  const ParamSpecs& params_;
  Strategy& strategy_;
  Communicator* group_;
  std::vector<float> part_, gathered_;
};

// Reads the whole model's parameters on every stage of a pipeline: each
// from the first stage holding it (read whole there), broadcast over the
// pipeline group (collective over it, in the caller's order).
class StageReader {
 public:
  StageReader(const ParamSpecs& stage, const ModelParts& parts, WholeReader& read)
      : parts_(parts), read_(read), local_(parts.whole ? parts.whole->size() : 0) {
    for (ParamId id : stage.ids())
      if (stage[id].model_id) local_.at(index_of(*stage[id].model_id)) = id;
  }
  void operator()(ParamId id, float* whole) {
    const ParamSpec& p = (*parts_.whole)[id];
    const std::size_t stages = static_cast<std::size_t>(parts_.pipeline->size());
    const std::size_t holder = pipeline::stages_holding(p, parts_.bounds, stages).front();
    if (holder == static_cast<std::size_t>(parts_.pipeline->rank())) {
      const std::optional<ParamId>& mine = local_[index_of(id)];
      if (!mine) throw InternalError("stage " + std::to_string(holder) + " lacks '" + p.name + "'");
      read_(*mine, whole);
    }
    parts_.pipeline->broadcast(whole, static_cast<std::size_t>(whole_spec(p).shape.numel()),
                               DType::f32, static_cast<int>(holder));
  }

 private:
  const ModelParts& parts_;
  WholeReader& read_;
  std::vector<std::optional<ParamId>> local_;  // the stage's id of each whole parameter
};

}  // namespace

void export_weights(const Model& model, Strategy& strategy, const fs::path& out, DType dtype,
                    bool write, const TextFiles& text, const ModelParts& parts) {
  const ParamSpecs stage = model.params();
  WholeReader whole_read(stage, strategy, parts.tensor);
  StageReader stage_read(stage, parts, whole_read);
  const bool staged = parts.pipeline != nullptr;
  const ParamSpecs& params = staged ? *parts.whole : stage;
  const ReadParam read = staged ? ReadParam(std::ref(stage_read)) : ReadParam(std::ref(whole_read));
  if (write) return write_weights(model, params, out, dtype, read, text);
  std::vector<float> full;
  for (ParamId p : export_order(params)) {  // the writer's order: the reads are collective
    full.resize(static_cast<std::size_t>(whole_spec(params[p]).shape.numel()));
    read(p, full.data());
  }
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
  const TextFiles files{dir ? text::tokenizer_in(source) : fs::path()};
  const fs::path target = prepare_target(out, config_json, dtype, files);
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
