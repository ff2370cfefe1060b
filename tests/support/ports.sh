# Sourced by the test scripts that start ranks torchrun-style.
# hold_port HOLDER FILE: starts HOLDER (ztrain_test_hold_port) in the
# background, which holds a free port while this shell lives, and sets
# $port to it (empty if none came within 5 s). Run it in the script's own
# shell, not in $(...): the port is held only while its parent lives.
hold_port() {
  "$1" > "$2" &
  for _ in $(seq 100); do
    [ -s "$2" ] && break
    sleep 0.05
  done
  port=$(cat "$2")
}
