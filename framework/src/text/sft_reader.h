// The host's SftReader (ztrain/sft_examples.h): LLaMA-Factory's datasets
// (text/sft_dataset.h) rendered and tokenized as its supervised
// preprocessing does (text/sft_encoding.h), the examples encoded in
// parallel, each row's problem kept with its file:line. `ztrain sft-check`
// reports what it reads; a run lends it to the data source.
//
// Errors: as SftReader::read; a template failing on one row is a
// ConfigError naming that row (the first such row in file order,
// whatever the threads). Thread safety: stateless.
#pragma once

#include "ztrain/sft_examples.h"

namespace ztrain::text {

SftExamples read_sft_examples(const SftRequest& request);

// The reader a run hands its data source.
const SftReader& host_sft_reader();

}  // namespace ztrain::text
