// Out-of-line virtual destructors: they anchor the vtables and type_info of
// the SDK's polymorphic types in libztrain, so host and plugins agree on one
// copy (exceptions and dynamic_cast across the boundary depend on it).
#include "ztrain/comm.h"
#include "ztrain/data.h"
#include "ztrain/error.h"
#include "ztrain/kernels.h"
#include "ztrain/model.h"
#include "ztrain/optimizer_state.h"
#include "ztrain/plugin.h"
#include "ztrain/strategy.h"

namespace ztrain {

Plugin::~Plugin() = default;
Model::~Model() = default;
Strategy::~Strategy() = default;
std::string Strategy::pipeline_refusal() const {
  return "it does not keep each rank's whole gradient until the step's last micro-batch (ZeRO-2 "
         "and ZeRO-3 reduce-scatter every micro-batch's gradients as its backward ends, ZeRO-3 "
         "gathers the parameters module by module): a pipeline stage interleaves its "
         "micro-batches' forwards and backwards, and a tied embedding's gradient is summed "
         "between two stages before the data-parallel reduction; use ddp or zero1 (ZeRO-1, as "
         "DeepSpeed's pipeline engine allows)";
}
DataSource::~DataSource() = default;
SftReader::~SftReader() = default;

void DataSource::fill_positions(Split, std::uint64_t, std::int32_t*) const {
  throw InternalError("DataSource::fill_positions called on a source that declares no segments");
}
Kernels::~Kernels() = default;
Communicator::~Communicator() = default;
void Communicator::announce_failure(const std::string&) {}
StateSink::~StateSink() = default;
StateSource::~StateSource() = default;

std::string_view state_array_name(StateArray a) {
  switch (a) {
    case StateArray::master:
      return "master";
    case StateArray::m:
      return "m";
    case StateArray::v:
      return "v";
  }
  return "?";
}

const char* host_build_id() {
  return ZTRAIN_BUILD_ID;
}

Error::~Error() = default;
ConfigError::~ConfigError() = default;
PluginError::~PluginError() = default;
DataError::~DataError() = default;
OutOfMemoryError::~OutOfMemoryError() = default;
IoError::~IoError() = default;
CommError::~CommError() = default;
NumericsError::~NumericsError() = default;
InternalError::~InternalError() = default;
}  // namespace ztrain
