// The launcher: `ztrain --nproc N ...` and `ztrain --hostfile FILE ...` start
// the job through mpirun, which runs ztrain again on every rank (the child
// finds its rank in the launcher's environment).
//
// Hostfiles use DeepSpeed's format: one `host slots=N` a line, `#` comments,
// blank lines ignored; a host named twice, a zero or missing slot count, or
// any other text is an error naming file:line. --include / --exclude take
// DeepSpeed's syntax, `host[:slot,slot][@host[:slot,...]]`, naming hosts (and
// slot indices) of the hostfile; naming an unknown host or slot is an error.
// Variables named by --env, and the VAR=VALUE lines of ./.ztrain_env (or
// ~/.ztrain_env), travel to every rank.
#pragma once

#include <string>
#include <vector>

namespace ztrain {

struct HostSlots {
  std::string host;
  std::vector<int> slots;  // indices 0..N-1 of the slots this job uses
};

// Raises ConfigError naming file:line for every malformed line.
std::vector<HostSlots> parse_hostfile(const std::string& path);
std::vector<HostSlots> parse_hostfile_text(const std::string& text, const std::string& name);
// Applies --include (keep only what is named) and --exclude (drop what is
// named); either may be empty.
std::vector<HostSlots> filter_hosts(std::vector<HostSlots> hosts, const std::string& include,
                                    const std::string& exclude);

// DeepSpeed's --num_nodes and --num_gpus (-1: not given): the first
// num_nodes hosts, the first num_gpus slots of each. ConfigError when a
// host has fewer slots, or the hostfile fewer hosts, than asked for.
std::vector<HostSlots> limit_hosts(std::vector<HostSlots> hosts, int num_nodes, int num_gpus);

struct LaunchPlan {
  int nproc = 0;                 // --nproc, or the slots of the hosts
  std::vector<HostSlots> hosts;  // empty: this machine only
  std::vector<std::string> env;  // VAR=VALUE for every rank
};

// The mpirun command line that runs `child_args` (ztrain and its arguments,
// minus the launcher's own) on every rank. With hosts, one application
// context per host whose CUDA_VISIBLE_DEVICES is the slot ids it uses, as
// DeepSpeed's launcher sets them; ConfigError when --nproc asks for more
// slots than the hosts have, or --env sets CUDA_VISIBLE_DEVICES beside them.
std::vector<std::string> mpirun_command(const LaunchPlan& plan,
                                        const std::vector<std::string>& child_args);

// The command as one line a POSIX shell reads back into the same words
// (--dry-run): a word with anything but letters, digits and -_./=:,@% is
// single-quoted.
std::string shell_line(const std::vector<std::string>& command);

// VAR=VALUE lines of a .ztrain_env file (missing file: none).
std::vector<std::string> read_env_file(const std::string& path);

// Runs mpirun (`command`) in a process group of its own and waits for it;
// mpirun is ended (SIGTERM) if this process dies first, however it dies.
// The first SIGINT, SIGTERM or SIGHUP to this process goes on to mpirun as
// SIGUSR1, which mpirun passes to every rank on every host without ending
// the job: each rank finishes its step, writes a checkpoint and exits 0,
// as one a scheduler signals does, so the job's status is the same on
// every rank and from here. A second signal goes on as SIGTERM, which
// ends the job at once. Returns mpirun's exit code (128 + the signal that
// ended it); Error when mpirun cannot start.
int run_mpirun(const std::vector<std::string>& command);

// A base for Open MPI's session directory of this job alone, for a job on
// this machine: a new directory under TMPDIR (or /tmp), set as
// OMPI_MCA_orte_tmpdir_base in this process's environment for mpirun to
// inherit, and removed with its contents when destroyed. Open MPI 4's
// default, /tmp/ompi.<host>.<uid>, is shared by every job of the user and
// made by checking, then creating: of two jobs starting at once, the second
// can fail before any rank starts ("A call to mkdir was unable to create
// the desired directory ... File exists"). A base the user set is kept
// (nothing is made or removed). Not for jobs on other hosts, whose daemons
// would be left the directory. Error when the directory cannot be made.
class OwnMpiSession {
 public:
  OwnMpiSession();
  ~OwnMpiSession();
  OwnMpiSession(const OwnMpiSession&) = delete;
  OwnMpiSession& operator=(const OwnMpiSession&) = delete;

 private:
  std::string dir_;  // empty: the user's base is kept
};

}  // namespace ztrain
