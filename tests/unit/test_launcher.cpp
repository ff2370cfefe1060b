// DeepSpeed hostfiles, --include/--exclude, .ztrain_env, the mpirun
// command the launcher builds, and Accelerate's launch arithmetic (both
// held to golden files their originals made).
#include <doctest/doctest.h>

#include <signal.h>
#include <unistd.h>
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <thread>

#include "config/accelerate_import.h"
#include "job/launcher.h"
#include "job/local_ranks.h"
#include "job/placement.h"
#include "support.h"

using namespace ztrain;

namespace {
bool contains(const std::string& s, const std::string& part) {
  INFO("message: " << s);
  return s.find(part) != std::string::npos;
}
std::string error_of(const std::string& text) {
  return test::message_of<ConfigError>([&] { parse_hostfile_text(text, "hosts"); });
}
}  // namespace

TEST_CASE("hostfiles: hosts with slots, comments and blank lines") {
  const auto hosts = parse_hostfile_text(
      "# cluster\nworker-0 slots=4\n\n  worker-1  slots = 2  # spare\n", "hosts");
  REQUIRE(hosts.size() == 2);
  CHECK(hosts[0].host == "worker-0");
  CHECK(hosts[0].slots == std::vector<int>{0, 1, 2, 3});
  CHECK(hosts[1].slots.size() == 2);
}

TEST_CASE("bad hostfiles name the line and the problem") {
  CHECK(contains(error_of("worker-0 slots=4\nworker-1 gpus=2\n"),
                 "hosts:2: expected 'hostname slots=N', got 'worker-1 gpus=2'"));
  CHECK(contains(error_of("worker-0\n"), "hosts:1: expected 'hostname slots=N'"));
  CHECK(
      contains(error_of("a slots=1\nb slots=2\na slots=3\n"), "hosts:3: host 'a' is listed twice"));
  CHECK(contains(error_of("a slots=0\n"), "hosts:1: host 'a' has slots=0"));
  // Found by fuzz_hostfile: a slot count past int was a std::out_of_range.
  CHECK(contains(error_of("a slots=33333333333333333333\n"),
                 "hosts:1: host 'a' has slots=33333333333333333333, more than 65536"));
  CHECK(contains(error_of("a slots=70000\n"), "more than 65536"));
  CHECK(contains(error_of("# nothing\n"), "lists no host"));
  CHECK(contains(test::message_of<ConfigError>([] { parse_hostfile("/nonexistent/hosts"); }),
                 "cannot read hostfile"));
}

TEST_CASE("--include and --exclude in DeepSpeed's syntax") {
  const auto all = parse_hostfile_text("w0 slots=4\nw1 slots=4\nw2 slots=2\n", "hosts");
  auto kept = filter_hosts(all, "w0:0,2@w2", "");
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].slots == std::vector<int>{0, 2});
  CHECK(kept[1].host == "w2");
  CHECK(kept[1].slots.size() == 2);
  kept = filter_hosts(all, "", "w1@w0:3");
  REQUIRE(kept.size() == 2);
  CHECK(kept[0].slots == std::vector<int>{0, 1, 2});
  CHECK(kept[1].host == "w2");
  CHECK(contains(
      test::message_of<ConfigError>([&] { filter_hosts(all, "w0:99999999999999999999", ""); }),
      "slot 99999999999999999999 is past any host's slots"));
  CHECK(contains(test::message_of<ConfigError>([&] { filter_hosts(all, "w9", ""); }),
                 "--include: host 'w9' is not in the hostfile"));
  CHECK(contains(test::message_of<ConfigError>([&] { filter_hosts(all, "", "w2:5"); }),
                 "--exclude: host 'w2' has no slot 5"));
  CHECK(contains(test::message_of<ConfigError>([&] { filter_hosts(all, "w0:x", ""); }),
                 "is not a slot index"));
  CHECK(contains(test::message_of<ConfigError>([&] { filter_hosts(all, "w0", "w1"); }),
                 "cannot be used together"));
  CHECK(contains(test::message_of<ConfigError>([&] { filter_hosts(all, "", "w0@w1@w2"); }),
                 "leaves no host"));
}

TEST_CASE("the mpirun command carries hosts, rank count, environment and the child's arguments") {
  LaunchPlan plan;
  plan.hosts = filter_hosts(parse_hostfile_text("a slots=4\nb slots=2\n", "h"), "a:1,3@b", "");
  plan.env = {"NCCL_DEBUG=INFO"};
  const auto cmd = mpirun_command(plan, {"/bin/ztrain", "--set", "train.steps=3", "run.toml"});
  std::string line;
  for (const auto& a : cmd) line += a + " ";
  // One application context per host, its GPUs the slot ids named (1 and
  // 3 of a, both of b), as DeepSpeed's launcher sets them.
  CHECK(contains(line,
                 "--bind-to none --stdin none --host a:2 -np 2 -x NCCL_DEBUG=INFO "
                 "-x CUDA_VISIBLE_DEVICES=1,3 /bin/ztrain --set train.steps=3 run.toml : "
                 "--host b:2 -np 2 -x NCCL_DEBUG=INFO -x CUDA_VISIBLE_DEVICES=0,1 "
                 "/bin/ztrain --set train.steps=3 run.toml "));
  // --exclude of one slot leaves the others, by id.
  plan.hosts = filter_hosts(parse_hostfile_text("a slots=4\nb slots=2\n", "h"), "", "a:0@b");
  line.clear();
  for (const auto& a : mpirun_command(plan, {"z"})) line += a + " ";
  CHECK(contains(line, "--host a:3 -np 3 -x NCCL_DEBUG=INFO -x CUDA_VISIBLE_DEVICES=1,2,3 z "));
  CHECK(!contains(line, "--host b"));
  // A GPU choice through the environment beside the slots is refused.
  plan.env.push_back("CUDA_VISIBLE_DEVICES=0");
  CHECK(contains(test::message_of<ConfigError>([&] { mpirun_command(plan, {"z"}); }),
                 "--env CUDA_VISIBLE_DEVICES (CUDA_VISIBLE_DEVICES=0) and the hostfile's slots"));
  LaunchPlan local;
  local.nproc = 64;
  std::string l2;
  for (const auto& a : mpirun_command(local, {"z", "r.toml"})) l2 += a + " ";
  CHECK(contains(l2, "--oversubscribe"));
  CHECK(contains(l2, "-np 64 "));
}

TEST_CASE("--nproc with a hostfile takes that many slots, and no more than it has") {
  LaunchPlan plan;
  plan.hosts = parse_hostfile_text("a slots=1\nb slots=1\n", "h");
  plan.nproc = 1;
  std::string line;
  for (const auto& a : mpirun_command(plan, {"z", "r.toml"})) line += a + " ";
  CHECK(contains(line, "--host a:1 -np 1 -x CUDA_VISIBLE_DEVICES=0 z r.toml "));
  CHECK(!contains(line, "--host b"));
  plan.nproc = 3;
  CHECK(contains(test::message_of<ConfigError>([&] {
                   mpirun_command(plan, {"z", "r.toml"});
                 }),
                 "--nproc 3 asks for more ranks than the 2 slots of the hosts (a:1,b:1)"));
}

TEST_CASE("DeepSpeed's --num_nodes and --num_gpus: the first hosts, the first slots of each") {
  const auto hosts = parse_hostfile_text("a slots=4\nb slots=2\nc slots=8\n", "h");
  const auto two = limit_hosts(hosts, 2, 2);
  REQUIRE(two.size() == 2);
  CHECK(two[0].host == "a");
  CHECK(two[0].slots == std::vector<int>{0, 1});
  CHECK(two[1].slots == std::vector<int>{0, 1});
  CHECK(limit_hosts(hosts, -1, -1).size() == 3);
  CHECK(contains(test::message_of<ConfigError>([&] { limit_hosts(hosts, -1, 3); }),
                 "--num_gpus 3: host 'b' has 2 slot(s)"));
  CHECK(contains(test::message_of<ConfigError>([&] { limit_hosts(hosts, 4, -1); }),
                 "--num_nodes 4: the hostfile has 3 host(s)"));
}

TEST_CASE(".ztrain_env holds VAR=VALUE lines") {
  test::TempDir dir;
  std::ofstream(dir / "env") << "# comment\nA=1\n\nB=two words\n";
  CHECK(read_env_file((dir / "env").string()) == std::vector<std::string>{"A=1", "B=two words"});
  std::ofstream(dir / "bad") << "JUSTANAME\n";
  CHECK(contains(test::message_of<ConfigError>([&] { read_env_file((dir / "bad").string()); }),
                 "bad:1: expected VAR=VALUE"));
  CHECK(read_env_file((dir / "missing").string()).empty());
}

TEST_CASE("--dry-run's line quotes what a shell would split or expand") {
  CHECK(shell_line({"mpirun", "-x", "FOO=a b$c", "--set", "train.out_dir=x y", "it's", "",
                    "plain/path-1.toml"}) ==
        "mpirun -x 'FOO=a b$c' --set 'train.out_dir=x y' 'it'\\''s' '' plain/path-1.toml");
}

TEST_CASE("placement: consecutive ranks of a host grouped, each rank's GPU in rank order") {
  using ztrain::placement_text;
  CHECK(placement_text({{"a", "1"}, {"a", "3"}, {"b", "0"}}, true) ==
        "ranks 0-1 on host a: GPU 1, 3 | rank 2 on host b: GPU 0");
  // A host met again later is a new group: rank order is kept.
  CHECK(placement_text({{"a", "0"}, {"b", "0"}, {"a", "1"}}, true) ==
        "rank 0 on host a: GPU 0 | rank 1 on host b: GPU 0 | rank 2 on host a: GPU 1");
  CHECK(placement_text({{"a", ""}, {"a", ""}}, false) == "ranks 0-1 on host a: cpu");
  CHECK(placement_text({{"a", "1"}, {"b", "0"}}, false) ==
        "rank 0 on host a: cpu (GPU slots 1 given, unused) | rank 1 on host b: cpu (GPU slots 0 "
        "given, unused)");
}

TEST_CASE("placement: a rank's GPU is CUDA_VISIBLE_DEVICES at its local rank") {
  const ztrain::test::ScopedEnv local("LOCAL_RANK", "1"), rank("RANK", "1"),
      world("WORLD_SIZE", "2");
  {
    const ztrain::test::ScopedEnv visible("CUDA_VISIBLE_DEVICES", "2,5");
    CHECK(ztrain::this_rank_place(true).gpu == "5");
    CHECK(ztrain::this_rank_place(false).gpu == "5");
  }
  {
    const ztrain::test::ScopedEnv visible("CUDA_VISIBLE_DEVICES", "4");
    CHECK(ztrain::this_rank_place(true).gpu == "none of 4");
  }
  const ztrain::test::ScopedEnv unset("CUDA_VISIBLE_DEVICES", nullptr);
  CHECK(ztrain::this_rank_place(true).gpu == "1");
  CHECK(ztrain::this_rank_place(false).gpu.empty());
}

TEST_CASE("a machine's share of a multi-machine job: ranks numbered from its machine rank") {
  const auto env = ztrain::local_rank_env({1, 2, 3, "10.0.0.1", 29600});
  REQUIRE(env.size() == 2);
  CHECK(env[1] == std::vector<std::string>{"RANK=3", "WORLD_SIZE=6", "LOCAL_RANK=1",
                                           "LOCAL_WORLD_SIZE=2", "GROUP_RANK=1",
                                           "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29600"});
  CHECK(env[0][0] == "RANK=2");
}

TEST_CASE("local ranks: each gets its variables, and when all exit 0 the job exits 0") {
  ztrain::test::TempDir dir;
  const std::string out = (dir / "ranks").string();
  const int rc = ztrain::run_local_ranks(
      {"/bin/sh", "-c", "echo \"$RANK $WORLD_SIZE $ZTRAIN_KEPT\" >> " + out},
      {{"RANK=0", "WORLD_SIZE=2"}, {"RANK=1", "WORLD_SIZE=2"}});
  CHECK(rc == 0);
  std::ifstream in(out);
  std::string a, b;
  std::getline(in, a);
  std::getline(in, b);
  if (a > b) std::swap(a, b);
  CHECK(a == "0 2 ");
  CHECK(b == "1 2 ");
}

TEST_CASE("local ranks: one that fails stops the others, and its status is the job's") {
  const auto t0 = std::chrono::steady_clock::now();
  const int rc = ztrain::run_local_ranks(
      {"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 3; fi; exec sleep 60"},
      {{"RANK=0"}, {"RANK=1"}, {"RANK=2"}});
  CHECK(rc == 3);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20));
  // One that does not stop on SIGTERM is killed after the grace period.
  const int stubborn = ztrain::run_local_ranks(
      {"/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 4; fi; trap '' TERM; sleep 60"},
      {{"RANK=0"}, {"RANK=1"}}, std::chrono::seconds(1));
  CHECK(stubborn == 4);
  CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(40));
}

TEST_CASE("local ranks: SIGTERM to the launcher reaches every rank once") {
  std::thread stop([] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    ::kill(::getpid(), SIGTERM);
  });
  const int rc =
      ztrain::run_local_ranks({"/bin/sh", "-c", "exec sleep 60"}, {{"RANK=0"}, {"RANK=1"}});
  stop.join();
  CHECK(rc == 128 + SIGTERM);
}

TEST_CASE("local ranks: a command that cannot start is an error naming it") {
  CHECK(ztrain::test::message_of<ztrain::Error>([] {
          ztrain::run_local_ranks({"/nonexistent/ztrain"}, {{"RANK=0"}});
        }).find("cannot start rank 0 ('/nonexistent/ztrain')") != std::string::npos);
}

TEST_CASE(
    "--include and --exclude keep the slots DeepSpeed's runner keeps, golden from DeepSpeed") {
  // tests/data/launcher/filters.json: tools/make_launcher_golden.py ran each
  // filter through deepspeed.launcher.runner.parse_inclusion_exclusion.
  // Where DeepSpeed raises, or keeps nothing (every slot excluded, which it
  // would start as an empty job), ztrain refuses.
  std::ifstream in(test::source_dir() / "tests/data/launcher/filters.json");
  const auto golden = nlohmann::json::parse(in);
  REQUIRE(golden["cases"].size() >= 50);
  for (const auto& c : golden["cases"]) {
    std::string hostfile;
    for (const auto& h : c["hosts"])
      hostfile += h[0].get<std::string>() + " slots=" + std::to_string(h[1].get<int>()) + "\n";
    const auto all = parse_hostfile_text(hostfile, "hosts");
    const std::string include = c["include"], exclude = c["exclude"];
    INFO("hosts " << c["hosts"].dump() << ", include '" << include << "', exclude '" << exclude
                  << "', DeepSpeed " << c["deepspeed"].dump());
    const auto& want = c["deepspeed"];
    if (want == "error" || want.empty()) {
      CHECK_THROWS_AS(filter_hosts(all, include, exclude), ConfigError);
      continue;
    }
    const auto kept = filter_hosts(all, include, exclude);
    REQUIRE(kept.size() == want.size());
    for (std::size_t i = 0; i < kept.size(); ++i) {
      CHECK(kept[i].host == want[i][0].get<std::string>());
      CHECK(kept[i].slots == want[i][1].get<std::vector<int>>());
    }
  }
}

namespace {

// A launch_golden.json case's expectations, checked against ztrain's
// reading of the same file: torchrun's numbers, or the deepspeed
// launcher's command line.
void check_torchrun(const AccelerateLaunch& l, const nlohmann::json& want) {
  CHECK(l.machines == want["nnodes"].get<int>());
  CHECK(l.per_machine() == want["nproc_per_node"].get<int>());
  CHECK(l.processes == l.machines * l.per_machine());
  CHECK(l.machine_rank == want["node_rank"].get<int>());
  if (l.machines == 1) return;  // ztrain starts them here: no rendezvous
  CHECK(l.main_ip + ":" + std::to_string(l.main_port) == want["rdzv_endpoint"].get<std::string>());
  const auto env =
      local_rank_env({l.machine_rank, l.per_machine(), l.machines, l.main_ip, l.main_port});
  REQUIRE(env.size() == want["ranks"].size());
  for (std::size_t local = 0; local < env.size(); ++local)
    for (const auto& [name, value] : want["ranks"][local].items()) {
      CAPTURE(name);
      CHECK(std::count(env[local].begin(), env[local].end(),
                       name + "=" + std::to_string(value.get<int>())) == 1);
    }
}

// deepspeed --hostfile H --no_local_rank --launcher L (--exclude E |
// --include I | --num_gpus N) [--master_addr A] --master_port P: ztrain
// starts the hostfile's ranks through mpirun, which needs no address.
void check_deepspeed(const AccelerateLaunch& l, const nlohmann::json& want) {
  const auto cmd = want["command"].get<std::vector<std::string>>();
  const auto after = [&](const std::string& flag) {
    const auto it = std::find(cmd.begin(), cmd.end(), flag);
    return it == cmd.end() ? std::string() : *(it + 1);
  };
  CHECK(l.hostfile.string() == after("--hostfile"));
  CHECK(l.exclude == after("--exclude"));
  CHECK(l.include == after("--include"));
  if (l.include.empty() && l.exclude.empty())
    CHECK(std::to_string(l.per_machine()) == after("--num_gpus"));
  CHECK(std::to_string(l.main_port) == after("--master_port"));
}

}  // namespace

TEST_CASE("accelerate launch: ranks, machines and filters are Accelerate's own") {
  // tests/data/accelerate/launch_golden.json: tools/make_accelerate_golden.py
  // ran each file through accelerate launch's parser, validation and
  // launcher preparation (accelerate 1.16.0).
  std::ifstream in(test::source_dir() / "tests/data/accelerate/launch_golden.json");
  const auto golden = nlohmann::json::parse(in);
  REQUIRE(golden["cases"].size() >= 15);
  test::TempDir dir;
  std::size_t refused = 0, simple = 0;
  for (const auto& c : golden["cases"]) {
    const std::string name = c["name"];
    CAPTURE(name);
    // JSON is YAML: the file as accelerate read it.
    const auto file = dir / (name + ".yaml");
    std::ofstream(file) << c["config"].dump();
    const auto& want = c["launch"];
    if (name == "six_on_four_machines") {
      // Accelerate starts 4 ranks (6 // 4 per machine) for a file asking 6:
      // ztrain refuses it rather than train at another world size.
      CHECK(want["ranks"][0]["WORLD_SIZE"] == 4);
      CHECK(contains(test::message_of<ConfigError>([&] { accelerate_launch(file); }),
                     "num_processes is 6 on 4 machines"));
      ++refused;
      continue;
    }
    const AccelerateLaunch l = accelerate_launch(file);
    if (want["launcher"] == "simple") {
      // accelerate launch starts one process for MULTI_CPU (no mpirun in
      // its command): the ranks are an mpirun's around it. ztrain starts
      // the num_processes the file names, the job it describes.
      CHECK(want["command"].empty());
      CHECK(l.processes == c["config"]["num_processes"].get<int>());
      ++simple;
    } else if (want["launcher"] == "torchrun") {
      check_torchrun(l, want);
    } else {
      check_deepspeed(l, want);
    }
  }
  CHECK(refused == 1);
  CHECK(simple == 1);
}
