# Sourced by slurm_local.sh and cluster_local.sh: the munge key every local Slurm
# cluster shares, /etc/munge/munge.key, created (0400, owner munge) when missing, and a
# munge directory of the caller's own.
#   ensure_munge_key PROG DIR    # PROG names the caller in its one line; DIR: chown munge
ensure_munge_key() {
  local prog="$1" dir="$2" key=/etc/munge/munge.key
  if [ ! -s "$key" ]; then
    mkdir -p /etc/munge
    (umask 077; head -c 1024 /dev/urandom > "$key.tmp") && mv "$key.tmp" "$key"
    echo "$prog: created $key"
  fi
  chown munge:munge /etc/munge "$key"
  chmod 700 /etc/munge
  chmod 400 "$key"
  chown munge:munge "$dir"
  chmod 755 "$dir"
}
