# Which .deepspeed_env reaches the nodes, seen in the --export list dsrun gives a stand-in `srun`
# (--launcher slurm starts no ssh): an absolute DS_ENV_FILE is read as it is (it was once looked
# up as $HOME/<path> and silently dropped), one that does not exist is an error naming it, and
# without DS_ENV_FILE ~/.deepspeed_env then ./.deepspeed_env are read (the later file wins), and
# likewise ~/NAME then ./NAME for a relative DS_ENV_FILE=NAME.
source "$(dirname "$0")/common.bash" "$1"

mkdir -p "$TMP/bin" "$TMP/home" "$TMP/work" "$TMP/etc"
cat >"$TMP/bin/srun" <<'SH'
#!/bin/sh
printf '%s\n' "$@" >"$SRUN_ARGS"
SH
chmod +x "$TMP/bin/srun"
printf 'h0 slots=1\nh1 slots=1\n' >"$TMP/hostfile"
cd "$TMP/work" || fail "cd $TMP/work"

# run_srun NAME [VAR=VALUE...]: dsrun --launcher slurm with HOME=$TMP/home; srun's arguments go to
# $TMP/NAME.args.
run_srun() {
  local name=$1
  shift
  env "$@" HOME="$TMP/home" PATH="$TMP/bin:$PATH" SRUN_ARGS="$TMP/$name.args" \
    timeout -s KILL 45 "$DSRUN" --hostfile "$TMP/hostfile" --launcher slurm "$WORKER" --mode ok \
    --marker "$MARKER" >"$TMP/$name.out" 2>"$TMP/$name.err"
  RC=$?
  [ $RC -ne 137 ] || fail "dsrun $name hung"
}
exports() { grep '^--export=' "$TMP/$1.args" | tr ',' '\n'; }

echo "FROM_ABSOLUTE=yes" >"$TMP/etc/job.env"
run_srun absolute DS_ENV_FILE="$TMP/etc/job.env"
[ $RC -eq 0 ] || fail "absolute DS_ENV_FILE: dsrun exited $RC"
exports absolute | grep -qxF "FROM_ABSOLUTE=yes" || fail "absolute DS_ENV_FILE not exported: $(exports absolute | tr '\n' ' ')"

run_srun missing DS_ENV_FILE="$TMP/etc/no_such.env"
[ $RC -eq 2 ] || fail "missing absolute DS_ENV_FILE: dsrun exited $RC, expected 2"
expect_contains "$TMP/missing.err" "dsrun: DS_ENV_FILE=$TMP/etc/no_such.env is not a file"
[ -e "$TMP/missing.args" ] && fail "srun ran although DS_ENV_FILE is missing"

printf 'FROM_ENV=home\nONLY_HOME=1\n' >"$TMP/home/.deepspeed_env"
printf 'FROM_ENV=cwd\n' >"$TMP/work/.deepspeed_env"
run_srun default
[ $RC -eq 0 ] || fail "default .deepspeed_env: dsrun exited $RC"
exports default | grep -qxF "FROM_ENV=cwd" || fail "./.deepspeed_env does not win over ~/"
exports default | grep -qxF "ONLY_HOME=1" || fail "~/.deepspeed_env not read"

# A relative DS_ENV_FILE is looked up like the default name, ~/NAME then ./NAME (the latter
# winning), as DeepSpeed's os.path.join(path, NAME) does, even though ./NAME exists as given (it
# was once read alone, dropping ~/NAME).
printf 'WHERE=home\nHOME_ONLY=1\n' >"$TMP/home/job.env"
printf 'WHERE=cwd\n' >"$TMP/work/job.env"
run_srun bare DS_ENV_FILE=job.env
[ $RC -eq 0 ] || fail "bare DS_ENV_FILE: dsrun exited $RC"
exports bare | grep -qxF "WHERE=cwd" || fail "bare DS_ENV_FILE: ./job.env does not win"
exports bare | grep -qxF "HOME_ONLY=1" || fail "bare DS_ENV_FILE: ~/job.env not read"
mkdir -p "$TMP/home/conf" "$TMP/work/conf"
printf 'WHERE=home\nHOME_ONLY=1\n' >"$TMP/home/conf/job.env"
printf 'WHERE=cwd\n' >"$TMP/work/conf/job.env"
run_srun subdir DS_ENV_FILE=conf/job.env
[ $RC -eq 0 ] || fail "DS_ENV_FILE=conf/job.env: dsrun exited $RC"
exports subdir | grep -qxF "WHERE=cwd" || fail "DS_ENV_FILE=conf/job.env: ./conf/job.env does not win"
exports subdir | grep -qxF "HOME_ONLY=1" || fail "DS_ENV_FILE=conf/job.env: ~/conf/job.env not read"

# Spaces around KEY and VALUE are dropped, as DeepSpeed's strip() does (`KEY = V` was refused). srun
# passes values on without a shell, so a `$VAR` reaches the ranks as written: dsrun says so.
printf 'EFA_PATH = /opt/efa/lib64:$LD_LIBRARY_PATH \nPLAIN= x\n' >"$TMP/etc/dollar.env"
run_srun dollar DS_ENV_FILE="$TMP/etc/dollar.env"
[ $RC -eq 0 ] || fail "spaced .deepspeed_env: dsrun exited $RC"
exports dollar | grep -qxF 'EFA_PATH=/opt/efa/lib64:$LD_LIBRARY_PATH' || fail "EFA_PATH not as written"
exports dollar | grep -qxF 'PLAIN=x' || fail "PLAIN's leading space kept"
expect_contains "$TMP/dollar.err" \
  'dsrun: warning: .deepspeed_env sets EFA_PATH=/opt/efa/lib64:$LD_LIBRARY_PATH; --launcher slurm passes it as written'
expect_absent "$TMP/dollar.err" "PLAIN"

no_leftovers
echo "PASS deepspeed_env_file"
