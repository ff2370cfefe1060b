// Initial weights (weights_import.h). Where some rank cannot see the file,
// rank 0 opens it and the master values travel through state_relay.h; m
// and v are zero everywhere.
#include "checkpoint/weights_import.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <set>
#include <string>

#include "checkpoint/state_relay.h"
#include "checkpoint/weights.h"
#include "core/host_name.h"
#include "job/rank_agreement.h"
#include "ztrain/error.h"
#include "ztrain/shard/init.h"

namespace ztrain {
namespace fs = std::filesystem;

namespace {

// The file's tensor for every parameter of `params`, matched by its
// Hugging Face name (else its own) and shape; what differs goes into d,
// the tensors matched into `used`.
IdVector<ParamId, SafetensorsSet::Tensor> match_list(const SafetensorsSet& file,
                                                     const ParamSpecs& params, TensorDifferences& d,
                                                     std::set<const SafetensorsEntry*>& used) {
  IdVector<ParamId, SafetensorsSet::Tensor> match(params.size(), {nullptr, nullptr});
  for (ParamId id : params.ids()) {
    const ParamSpec p = whole_spec(params[id]);  // a tensor-parallel part reads the whole's
    auto found = file.find(external_name(p));
    if (!found) found = file.find(p.name);
    if (!found && p.adapter) continue;  // drawn from the seed
    if (!found) {
      d.missing.push_back(external_name(p) + " " + external_shape(p).str());
      continue;
    }
    const SafetensorsEntry* e = found->entry;
    used.insert(e);
    if (e->shape != external_shape(p)) {
      d.misshaped.push_back(e->name + ": shape " + e->shape.str() + " in the file, " +
                            external_shape(p).str() + " expected" +
                            (p.hf_transposed ? " (Hugging Face Conv1D layout: in, out)" : ""));
      continue;
    }
    match[id] = *found;
  }
  return match;
}

// The file's tensor for every parameter of `model`; DataError listing every
// difference between the file and the model (the whole model's `whole`
// under pipeline parallelism, of which a stage reads its own).
IdVector<ParamId, SafetensorsSet::Tensor> match_params(const SafetensorsSet& file,
                                                       const Model& model,
                                                       const ParamSpecs* whole) {
  TensorDifferences d;
  std::set<const SafetensorsEntry*> used;
  auto match = match_list(file, model.params(), d, used);
  if (whole) {
    d = {};
    used.clear();
    match_list(file, *whole, d, used);
  }
  for (const SafetensorsSet::Tensor& t : file.all())
    if (!used.contains(t.entry) && !model.ignorable_tensor(t.entry->name))
      d.unexpected.push_back(t.entry->name + " " + t.entry->shape.str());
  if (d.count() > 0)
    throw DataError(file.path().string() + ": does not match the " + model.info().arch +
                    " model of this run (" + std::to_string(d.count()) +
                    " differences):" + d.listed() +
                    "\ncheck [model] arch, n_layer, n_embd, n_head, vocab_size and seq_len");
  return match;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Some rank cannot see the file: rank 0 reads it for them (above).
WeightsImport import_through_rank_0(const Model& model, const WeightsTarget& target,
                                    const fs::path& path, bool seen, Communicator& comm) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string why;
  std::optional<SafetensorsSet> reader;
  std::optional<WeightsFile> file;
  if (comm.rank() == 0) {
    try {
      if (!seen)
        throw DataError("init_from: no weights at '" + path.string() + "' on rank 0 (host " +
                        host_name() +
                        "), which reads them for the ranks that cannot; give a .safetensors file "
                        "or a directory holding model.safetensors or model.safetensors.index.json");
      reader.emplace(path);
      file.emplace(*reader, model, target.seed, target.whole);
    } catch (const DataError& e) {
      why = e.what();
    }
  }
  stop_together<DataError>(why, "init_from: rank 0 cannot read the weights (its error is above)",
                           comm);
  const std::uint64_t moved =
      load_through_rank_0(target.load, file ? &*file : nullptr, true, "init_from", comm);
  stop_together<DataError>(file ? file->not_finite() : std::string(),
                           "init_from: rank 0 found a value that is not finite (its error names "
                           "the tensor)",
                           comm);
  WeightsImport w;
  w.from_rank_0 = true;
  w.bytes_read = file ? file->bytes_read() : 0;
  w.file_bytes = file ? file->file_bytes() : 0;
  w.bytes_moved = moved;
  w.seconds = seconds_since(t0);
  return w;
}

}  // namespace

WeightsFile::WeightsFile(const SafetensorsSet& file, const Model& model, std::uint64_t seed,
                         const ParamSpecs* whole)
    : file_(file), params_(model.params()), match_(match_params(file, model, whole)), seed_(seed) {}

std::uint64_t WeightsFile::file_bytes() const {
  std::uint64_t bytes = 0;
  for (const SafetensorsSet::Tensor& t : match_)
    if (t.entry) bytes += t.entry->bytes;
  return bytes;
}

void WeightsFile::get(ParamId p, std::uint64_t first, std::uint64_t count, StateArray a,
                      float* out) {
  if (a != StateArray::master) return std::fill(out, out + count, 0.0f);  // a fresh optimizer
  const SafetensorsSet::Tensor& t = match_.at(p);
  if (!t.entry) return shard::initial_values(params_[p], index_of(p), seed_, first, count, out);
  if (params_[p].split.dim >= 0) {
    read_part(p, first, count, out);
  } else if (params_[p].hf_transposed) {
    read_transposed(t, params_[p].shape, first, count, out);
  } else {
    t.file->read_f32(*t.entry, first, count, out);
    bytes_read_ += count * dtype_size(t.entry->dtype);
  }
  check_finite(p, first, count, out);
}

// Element i of the part is the whole's element w = whole_index(i), (r, c)
// of the whole (R, C), which the file holds at w, or at c * R + r where it
// keeps the transpose. Elements whose file places run on are read at once:
// a row of a part cut by rows, a section's columns of a part cut by them.
void WeightsFile::read_part(ParamId p, std::uint64_t first, std::uint64_t count, float* out) {
  const ParamSpec& spec = params_[p];
  const SafetensorsSet::Tensor& t = match_.at(p);
  const Shape whole = whole_spec(spec).shape;
  const std::uint64_t R = static_cast<std::uint64_t>(whole[0]),
                      C = whole.rank() > 1 ? static_cast<std::uint64_t>(whole[1]) : 1;
  const auto at = [&](std::uint64_t i) {
    const std::uint64_t w = spec.split.whole_index(spec.shape, i);
    return spec.hf_transposed ? w % C * R + w / C : w;
  };
  for (std::uint64_t i = first; i < first + count;) {
    const std::uint64_t start = at(i);
    std::uint64_t n = 1;
    while (i + n < first + count && at(i + n) == start + n) ++n;
    t.file->read_f32(*t.entry, start, n, out + (i - first));
    bytes_read_ += n * dtype_size(t.entry->dtype);
    i += n;
  }
}

void WeightsFile::check_finite(ParamId p, std::uint64_t first, std::uint64_t count,
                               const float* values) {
  if (!not_finite_.empty()) return;
  const float* bad =
      std::find_if(values, values + count, [](float v) { return !std::isfinite(v); });
  if (bad == values + count) return;
  not_finite_ = "init_from: tensor '" + match_[p].entry->name + "' (parameter " + params_[p].name +
                ") holds " + std::to_string(*bad) + " at element " +
                std::to_string(first + static_cast<std::uint64_t>(bad - values)) +
                " of the model's layout; weights that are not finite cannot train (saved from a "
                "run that diverged?): give other weights";
}

// Model element (i, j) of shape (R, C) is the file's (j, i): for each file
// row j the model rows i with first <= i*C + j < first + count are one
// contiguous segment of it.
void WeightsFile::read_transposed(const SafetensorsSet::Tensor& t, const Shape& shape,
                                  std::uint64_t first, std::uint64_t count, float* out) {
  const auto R = static_cast<std::uint64_t>(shape[0]), C = static_cast<std::uint64_t>(shape[1]);
  const std::uint64_t end = first + count;
  for (std::uint64_t j = 0; j < C; ++j) {
    const std::uint64_t lo = first > j ? (first - j + C - 1) / C : 0;
    const std::uint64_t hi = std::min(R, end > j ? (end - j + C - 1) / C : 0);
    if (lo >= hi) continue;
    segment_.resize(static_cast<std::size_t>(hi - lo));
    t.file->read_f32(*t.entry, j * R + lo, hi - lo, segment_.data());
    for (std::uint64_t i = lo; i < hi; ++i) out[i * C + j - first] = segment_[i - lo];
    bytes_read_ += (hi - lo) * dtype_size(t.entry->dtype);
  }
}

WeightsImport import_weights(const Model& model, const WeightsTarget& target, const fs::path& in,
                             Communicator& comm) {
  const fs::path path = SafetensorsSet::weights_at(in);
  const bool seen = fs::exists(path);
  if (comm.size() > 1 && any_rank(!seen, comm)) {
    // Rank 0 reads its own parts' places: a tensor-parallel rank needs its.
    if (has_tensor_parts(model.params()))
      throw DataError("init_from: '" + path.string() +
                      "' is not on every rank's host, and a tensor-parallel run's ranks each read "
                      "their parts of it; put the weights where every rank sees them");
    return import_through_rank_0(model, target, path, seen, comm);
  }
  // Every rank reads its own ranges.
  const auto t0 = std::chrono::steady_clock::now();
  if (!seen)
    throw DataError("init_from: no weights at '" + path.string() +
                    "'; give a .safetensors file or a directory holding model.safetensors or "
                    "model.safetensors.index.json");
  const SafetensorsSet reader(path);
  if (comm.size() > 1) check_files_agree("init_from", reader.files(), comm);  // none stale
  WeightsFile file(reader, model, target.seed, target.whole);
  target.load(file);
  stop_together<DataError>(file.not_finite(),
                           "init_from: another rank found a value that is not finite (its error "
                           "names the tensor)",
                           comm);
  WeightsImport w;
  w.bytes_read = file.bytes_read();
  w.file_bytes = file.file_bytes();
  w.seconds = seconds_since(t0);
  return w;
}

}  // namespace ztrain
