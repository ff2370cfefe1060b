// The charts of one or more training jobs, as figures for an HTML report
// (html_report.h), drawn with svg_chart.h: the curves over steps (training
// and validation loss, gradient norm, learning rate, step time,
// throughput, peak device memory), the difference of each job's loss and
// gradient norm from a reference job's, peak memory per tier and category
// against the device's memory limit (a job that ran out of memory drawn
// with what it held and what it asked for), and communication per step.
// `ztrain compare` draws its strategies' jobs, `ztrain report` its runs.
//
// Thread safety: pure functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "commands/compare_report.h"

namespace ztrain {

const char* job_colour(std::size_t i);

std::string curve_figures(const std::vector<ComparedJob>& jobs);

// Each completed job's relative loss and gradient-norm difference from
// `reference`'s per step, on a log scale with the tolerances; empty when
// there is no other completed job.
std::string difference_figures(const std::vector<ComparedJob>& jobs, const std::string& reference,
                               const Tolerance& tol);

std::string memory_figures(const std::vector<ComparedJob>& jobs,
                           std::optional<std::uint64_t> device_limit);

std::string comm_figures(const std::vector<ComparedJob>& jobs);

}  // namespace ztrain
