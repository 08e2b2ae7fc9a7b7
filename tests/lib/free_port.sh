# Sourced by the shell test scripts: `free_port` prints a random loopback port nothing answers
# on, below the kernel's ephemeral range (32768+), where an outgoing connection could take it
# before the server binds. The machine may run another gpud, or the same script twice.
free_port() {
  local port
  for _ in $(seq 100); do
    port=$((20000 + RANDOM % 12000))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  echo "no free loopback port between 20000 and 32000" >&2
  exit 1
}
