#!/usr/bin/env python3
"""How `accelerate launch` starts the ranks of an Accelerate config file, from
Accelerate's own code: tests/data/accelerate/launch_golden.json.

What it does
    Writes each config of cases() (single and multi-machine MULTI_GPU, FSDP and
    DEEPSPEED files; the standard launcher with and without same_network; DeepSpeed's
    pdsh and openmpi launchers with and without their filters; a rank count that
    does not divide among the machines) to a YAML file, and runs accelerate launch's
    own steps on it: launch_command_parser, _validate_launch_command (which reads the
    file through Accelerate's config classes), then prepare_multi_gpu_env or
    prepare_deepspeed_cmd_env, exactly as launch_command would before starting
    anything. It records what they decided:
      torchrun launches: nproc_per_node, nnodes, node_rank and where the machines
        meet (rdzv_endpoint, or master_addr/master_port under same_network), and
        each local rank's RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE and
        GROUP_RANK as torchrun's static rendezvous numbers them (group_rank =
        node_rank; rank = group_rank * nproc_per_node + local_rank);
      the deepspeed launcher: its command line (hostfile, --include / --exclude /
        --num_gpus, --master_addr, --master_port);
      the simple launcher (MULTI_CPU): its command line, one process.
    tests/unit/test_accelerate_launch.cpp reads each case's file through ztrain's
    accelerate_launch and local_rank_env and must give the same numbers, or refuse
    the cases listed there (a rank count Accelerate divides down silently).

How to rerun
    ../shared/peers/setup_venv.sh /tmp/peers-venv && /tmp/peers-venv/venv/bin/pip install accelerate
    /tmp/peers-venv/venv/bin/python tools/make_accelerate_golden.py   # from the repository root

Versions used for the committed file: accelerate 1.16.0 (stored in it). Never needed
by CI: the test reads the committed JSON.
"""

import json
import os
import socket
import sys
import tempfile

import accelerate
import yaml
from accelerate.commands.launch import _validate_launch_command, launch_command_parser
from accelerate.utils.launch import (prepare_deepspeed_cmd_env, prepare_multi_gpu_env,
                                    prepare_simple_launcher_cmd_env)

OUT = os.path.join("tests", "data", "accelerate", "launch_golden.json")
HOSTFILE = "tests/data/accelerate/hostfile"


def config(kind, processes, machines=1, rank=0, **extra):
    c = {"compute_environment": "LOCAL_MACHINE", "distributed_type": kind,
         "mixed_precision": "bf16", "num_processes": processes, "num_machines": machines,
         "machine_rank": rank, "use_cpu": False}
    if machines > 1:
        c.update({"main_process_ip": "10.0.0.1", "main_process_port": 29500,
                  "rdzv_backend": "static", "same_network": False})
    if kind == "DEEPSPEED":
        c["deepspeed_config"] = {"zero_stage": 2, "offload_optimizer_device": "none",
                                 "offload_param_device": "none", "zero3_init_flag": False}
    if kind == "FSDP":
        c["fsdp_config"] = {"fsdp_sharding_strategy": "FULL_SHARD", "fsdp_version": 1}
    for key, value in extra.items():
        if key.startswith("ds_"):
            c["deepspeed_config"][key[3:]] = value
        else:
            c[key] = value
    return c


def cases():
    out = {
        "one_gpu": config("MULTI_GPU", 1),
        "eight_gpus": config("MULTI_GPU", 8),
        "fsdp_four": config("FSDP", 4),
        "deepspeed_one_machine": config("DEEPSPEED", 8),
        "two_machines_rank0": config("MULTI_GPU", 16, 2, 0),
        "two_machines_rank1": config("MULTI_GPU", 16, 2, 1),
        "three_machines_rank2_port": config("MULTI_GPU", 24, 3, 2, main_process_port=29617),
        "four_machines_one_each": config("MULTI_GPU", 4, 4, 3),
        "two_machines_one_each_rank1": config("MULTI_GPU", 2, 2, 1),
        "eight_machines_rank5": config("FSDP", 64, 8, 5),
        "same_network_rank1": config("MULTI_GPU", 8, 2, 1, same_network=True,
                                     main_process_ip="192.168.7.3", main_process_port=31000),
        "deepspeed_standard_rank1": config("DEEPSPEED", 16, 2, 1,
                                           ds_deepspeed_multinode_launcher="standard"),
        "deepspeed_pdsh": config("DEEPSPEED", 4, 2, 0, ds_deepspeed_hostfile=HOSTFILE,
                                 ds_deepspeed_multinode_launcher="pdsh"),
        "deepspeed_pdsh_exclude": config("DEEPSPEED", 4, 2, 0, ds_deepspeed_hostfile=HOSTFILE,
                                         ds_deepspeed_multinode_launcher="pdsh",
                                         ds_deepspeed_exclusion_filter="worker-1:1"),
        "deepspeed_openmpi_include": config("DEEPSPEED", 4, 2, 0, ds_deepspeed_hostfile=HOSTFILE,
                                            ds_deepspeed_multinode_launcher="openmpi",
                                            ds_deepspeed_inclusion_filter="worker-1@worker-2:0"),
        "deepspeed_pdsh_both_filters": config("DEEPSPEED", 4, 2, 0,
                                              ds_deepspeed_hostfile=HOSTFILE,
                                              ds_deepspeed_multinode_launcher="pdsh",
                                              ds_deepspeed_inclusion_filter="worker-1",
                                              ds_deepspeed_exclusion_filter="worker-2:0"),
        # accelerate launch's simple launcher: one process, whatever
        # num_processes says (its ranks come from an mpirun around it).
        "multi_cpu_four": dict(config("MULTI_CPU", 4), use_cpu=True),
        # Accelerate divides 6 ranks among 4 machines as 1 each (a job of 4):
        # ztrain refuses the file instead.
        "six_on_four_machines": config("MULTI_GPU", 6, 4, 0),
    }
    return out


def free_port_guard(cfg):
    """Accelerate checks machine 0's port is free on this machine; a busy one
    changes the launch (standalone), so the cases' ports must be free here."""
    port = cfg.get("main_process_port", 29500)
    with socket.socket() as s:
        assert s.connect_ex(("localhost", port)) != 0, f"port {port} is in use here"


def torchrun_ranks(args):
    nproc, nnodes = int(args.nproc_per_node), int(getattr(args, "nnodes", 1) or 1)
    group = int(getattr(args, "node_rank", 0) or 0)
    return [{"RANK": group * nproc + local, "WORLD_SIZE": nnodes * nproc, "LOCAL_RANK": local,
             "LOCAL_WORLD_SIZE": nproc, "GROUP_RANK": group} for local in range(nproc)]


def launch_of(path, cfg):
    args = launch_command_parser().parse_args(["--config_file", path, "train.py"])
    args, _, _ = _validate_launch_command(args)
    free_port_guard(cfg)
    if args.use_deepspeed:
        # As launch_command sets it before calling the deepspeed launcher.
        args.deepspeed_fields_from_accelerate_config = list(cfg["deepspeed_config"])
        cmd, _ = prepare_deepspeed_cmd_env(args)
        if cmd is not None:
            return {"launcher": "deepspeed", "command": cmd[:cmd.index("train.py")]}
    elif not args.multi_gpu and not args.use_fsdp:
        cmd, _ = prepare_simple_launcher_cmd_env(args)
        # What runs before the interpreter: mpirun and its flags, or nothing
        # (then one process starts).
        return {"launcher": "simple", "command": cmd[:cmd.index(sys.executable)]}
    else:
        prepare_multi_gpu_env(args)
    out = {"launcher": "torchrun", "nproc_per_node": int(args.nproc_per_node),
           "nnodes": int(getattr(args, "nnodes", 1) or 1),
           "node_rank": int(getattr(args, "node_rank", 0) or 0)}
    if getattr(args, "rdzv_endpoint", None):
        out["rdzv_endpoint"] = args.rdzv_endpoint
    if getattr(args, "master_addr", None):
        out["master_addr"] = args.master_addr
    if getattr(args, "master_port", None):
        out["master_port"] = int(args.master_port)
    out["ranks"] = torchrun_ranks(args)
    return out


def main():
    golden = {"generator": "tools/make_accelerate_golden.py",
              "accelerate": accelerate.__version__, "cases": []}
    with tempfile.TemporaryDirectory() as tmp:
        for name, cfg in cases().items():
            path = os.path.join(tmp, name + ".yaml")
            with open(path, "w") as f:
                yaml.safe_dump(cfg, f)
            launch = launch_of(path, cfg)
            golden["cases"].append({"name": name, "config": cfg, "launch": launch})
            print(name, json.dumps(launch)[:150])
    with open(OUT, "w") as f:
        json.dump(golden, f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
