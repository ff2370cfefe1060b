// DeepSpeed-style hostfiles and --include/--exclude filters: the first line
// is "include|exclude", the rest the hostfile.
#include "fuzz_input.h"
#include "job/launcher.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string input = ztrain::fuzz::text(data, size);
  const auto nl = input.find('\n');
  const std::string first = input.substr(0, nl),
                    rest = nl == std::string::npos ? "" : input.substr(nl + 1);
  const auto bar = first.find('|');
  const std::string include = first.substr(0, bar),
                    exclude = bar == std::string::npos ? "" : first.substr(bar + 1);
  ztrain::fuzz::expect_clean([&] {
    auto hosts = ztrain::parse_hostfile_text(rest, "fuzz-hostfile");
    hosts = ztrain::filter_hosts(hosts, include, exclude);
    ztrain::LaunchPlan plan;
    plan.hosts = hosts;
    ztrain::mpirun_command(plan, {"ztrain", "run.toml"});
  });
  return 0;
}
