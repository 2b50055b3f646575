#!/usr/bin/env bash
# Builds the read-only layers of the code-interpreter-v1 template (local runtime), on top of
# sandbox-base's root filesystem (scripts/build-rootfs.sh):
#
#   packages  /opt/torpor/venv: Debian's python3 in a venv (owned by `user`: `pip install`
#             works there) with the kernels, the execution server's libraries and the data
#             stack of deploy/code-interpreter/requirements.txt, from PyPI; the bash kernel.
#   deno      /opt/torpor/deno: Deno's Jupyter kernel (javascript, typescript), from npm.
#   r         R and IRkernel (kernel spec `ir`), Debian's packages.
#   java      OpenJDK 17 and torpor's JShell kernel (spec `java`, deploy/code-interpreter/java).
#   server    /opt/torpor/interpreter: the execution server (services/interpreter) and the
#             IPython profile of deploy/code-interpreter/ipython.
#
# Each is an overlayfs upper tree (sandbox ids: 0 = its root, 1000 = `user`; whiteouts as
# overlayfs writes them), cached outside the repo in
# ${TORPOR_LAYER_CACHE:-~/.cache/torpor/layers}/code-interpreter-<layer>/<hash>/tree
# with `current` naming the newest; <hash> covers the base rootfs and every input, so a warm run
# returns at once. The package layer takes a few minutes cold (downloads from PyPI, uv's cache in
# ~/.cache/torpor/uv); r and java about 30 s each (apt, .debs kept in ~/.cache/torpor/apt); the
# server layer is a copy. Needs root (overlayfs, chroot). Prints the layer folders on stdout;
# progress goes to stderr. The template stacks them in this order (code-interpreter-v1.yaml).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
SRC="$REPO/deploy/code-interpreter"
CACHE=${TORPOR_LAYER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/torpor/layers}
UV_CACHE=${TORPOR_UV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/torpor/uv}
UV=${UV:-$REPO/.venv/bin/uv}

need_root() {
  if [[ $(id -u) != 0 ]]; then
    echo "build-code-interpreter: must run as root (overlayfs, chroot, sandbox ids)" >&2
    exit 2
  fi
}
ROOTFS=$("$REPO/scripts/build-rootfs.sh" | tail -n 1)
BASE_HASH=$(basename "$ROOTFS")
mkdir -p "$CACHE" "$UV_CACHE"
exec 9>"$CACHE/.code-interpreter.lock"
flock 9

publish() {  # <kind> <hash>: `current` names it
  ln -sfn "$2" "$CACHE/$1/.current.new" && mv -T "$CACHE/$1/.current.new" "$CACHE/$1/current"
  echo "$CACHE/$1/$2"
}

# ---- packages ----------------------------------------------------------------------------
PKG_HASH=$( { echo "$BASE_HASH"; cat "$SRC/requirements.txt"; sed -n '/^# ---- packages/,/^# ---- deno/p' "$0"; } | sha256sum | cut -c1-16)
PKG="$CACHE/code-interpreter-packages/$PKG_HASH"
if [[ ! -f $PKG/done ]]; then
  need_root
  if [[ ! -x $UV ]]; then
    echo "build-code-interpreter: uv is missing ($UV; scripts/setup.sh installs it)" >&2
    exit 2
  fi
  PARTIAL="$PKG.partial"
  cleanup() {
    for m in tmp/uv-cache dev/pts dev proc ""; do
      if mountpoint -q "$PARTIAL/merged/$m" 2>/dev/null; then umount -l "$PARTIAL/merged/$m" || true; fi
    done
  }
  trap cleanup EXIT
  cleanup
  rm -rf "$PARTIAL"
  mkdir -p "$PARTIAL/tree" "$PARTIAL/work" "$PARTIAL/merged"
  start=$(date +%s)
  echo "build-code-interpreter: packages layer $PKG_HASH on rootfs $BASE_HASH" >&2
  mount -t overlay overlay -o "lowerdir=$ROOTFS,upperdir=$PARTIAL/tree,workdir=$PARTIAL/work,index=off,metacopy=off" "$PARTIAL/merged"
  M="$PARTIAL/merged"
  mount -t proc proc "$M/proc"
  mount --bind /dev "$M/dev"
  mount --bind /dev/pts "$M/dev/pts"
  mkdir -p "$M/tmp/uv-cache"
  mount --bind "$UV_CACHE" "$M/tmp/uv-cache"
  cp /etc/resolv.conf "$M/etc/resolv.conf"
  install -m 0755 "$UV" "$M/tmp/uv"
  cp "$SRC/requirements.txt" "$M/tmp/requirements.txt"
  # The build host's CA bundle (an egress proxy's CA, if any), for this build only.
  cp "${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}" "$M/tmp/ca.crt"
  in_root() {
    chroot "$M" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 HOME=/root \
      UV_CACHE_DIR=/tmp/uv-cache UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never \
      SSL_CERT_FILE=/tmp/ca.crt "$@"
  }
  in_root /tmp/uv venv --quiet --seed --python /usr/bin/python3 /opt/torpor/venv >&2
  in_root /tmp/uv pip install --quiet --compile-bytecode --python /opt/torpor/venv/bin/python \
    -r /tmp/requirements.txt >&2
  # Kernel specs in the venv (jupyter_client finds sys.prefix/share/jupyter/kernels).
  in_root /opt/torpor/venv/bin/python -m bash_kernel.install --sys-prefix >&2
  in_root /opt/torpor/venv/bin/python -m ipykernel install --sys-prefix --name python3 >&2
  chown -R 1000:1000 "$M/opt/torpor/venv"
  # Login shells (the SDK's commands run `bash -l`) reset PATH in /etc/profile: the venv first.
  printf '%s\n' '# code-interpreter-v1: its venv first (pip, python, jupyter)' \
    'export PATH=/opt/torpor/venv/bin:$PATH VIRTUAL_ENV=/opt/torpor/venv' > "$M/etc/profile.d/torpor-venv.sh"
  cleanup
  trap - EXIT
  # Nothing of the build host stays: the pod gets its own resolv.conf; /tmp and caches go.
  rm -rf "$PARTIAL/tree/etc/resolv.conf" "$PARTIAL/tree/tmp" "$PARTIAL/tree/root" "$PARTIAL/merged" "$PARTIAL/work"
  echo "code-interpreter-packages $PKG_HASH $(date -u +%FT%TZ)" > "$PARTIAL/done"
  rm -rf "$PKG"
  mv "$PARTIAL" "$PKG"
  echo "build-code-interpreter: packages built in $(( $(date +%s) - start ))s" >&2
fi
publish code-interpreter-packages "$PKG_HASH"

# ---- deno --------------------------------------------------------------------------------
# The javascript/typescript kernel: Deno's own Jupyter kernel (`deno jupyter --kernel`; ESM,
# top-level await, TypeScript), the binary from npm (@deno/linux-x64-glibc, fetched with `npm
# pack`, which checks its integrity). Without npm on the build host the layer is empty and the
# template has python and bash only.
DENO_PKG=@deno/linux-x64-glibc@2.9.6
DENO_HASH=$( { echo "$DENO_PKG"; sed -n '/^# ---- deno/,/^# ---- end/p' "$0"; } | sha256sum | cut -c1-16)
DENO="$CACHE/code-interpreter-deno/$DENO_HASH"
if [[ ! -f $DENO/done ]]; then
  need_root
  PARTIAL="$DENO.partial"
  rm -rf "$PARTIAL"
  mkdir -p "$PARTIAL/tree" "$PARTIAL/pack"
  if command -v npm >/dev/null 2>&1 && [[ $(uname -m) == x86_64 ]]; then
    (cd "$PARTIAL/pack" && npm pack --silent --cache "${XDG_CACHE_HOME:-$HOME/.cache}/torpor/npm-cache" "$DENO_PKG" >/dev/null)
    tar -xzf "$PARTIAL"/pack/*.tgz -C "$PARTIAL/pack"
    install -D -m 0755 "$PARTIAL/pack/package/deno" "$PARTIAL/tree/opt/torpor/deno/deno"
    SPEC="$PARTIAL/tree/opt/torpor/venv/share/jupyter/kernels/javascript"
    mkdir -p "$SPEC"
    cat > "$SPEC/kernel.json" <<'JSON'
{
  "argv": ["/opt/torpor/deno/deno", "jupyter", "--kernel", "--conn", "{connection_file}"],
  "display_name": "JavaScript and TypeScript (Deno)",
  "language": "typescript",
  "env": {"DENO_NO_UPDATE_CHECK": "1", "NO_COLOR": "1", "DENO_NO_PROMPT": "1"}
}
JSON
  else
    echo "build-code-interpreter: no npm (or not x86_64): the template gets no javascript kernel" >&2
  fi
  rm -rf "$PARTIAL/pack"
  chown -R 0:0 "$PARTIAL/tree"
  echo "code-interpreter-deno $DENO_HASH $(date -u +%FT%TZ)" > "$PARTIAL/done"
  rm -rf "$DENO"
  mv "$PARTIAL" "$DENO"
fi
publish code-interpreter-deno "$DENO_HASH"
# ---- end

# ---- apt layers --------------------------------------------------------------------------
# R and Java: Debian bookworm's packages, apt-get in a chroot on the layers below (overlayfs, so
# the tree holds only what apt wrote, dpkg's status included: the upper layer's status lists
# the packages of the layers beneath too). The .debs are kept in ~/.cache/torpor/apt between
# builds (a rebuild downloads nothing); apt's lists, caches and the host's resolv.conf stay out.
APT_CACHE=${TORPOR_APT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/torpor/apt}
apt_layer() {  # <kind> <hash> <lowerdir> <script run in the chroot after apt> <packages...>
  local kind=$1 hash=$2 lowers=$3 after=$4
  shift 4
  local out="$CACHE/$kind/$hash"
  [[ -f $out/done ]] && return 0
  need_root
  local partial="$out.partial" start
  start=$(date +%s)
  APT_M="$partial/merged"
  apt_cleanup() {
    for m in var/cache/apt/archives tmp/src dev/pts dev proc ""; do
      if mountpoint -q "$APT_M/$m" 2>/dev/null; then umount -l "$APT_M/$m" || true; fi
    done
  }
  trap apt_cleanup EXIT
  apt_cleanup
  rm -rf "$partial"
  mkdir -p "$partial/tree" "$partial/work" "$APT_M" "$APT_CACHE/partial"
  echo "build-code-interpreter: $kind layer $hash: apt-get install $*" >&2
  mount -t overlay overlay -o "lowerdir=$lowers,upperdir=$partial/tree,workdir=$partial/work,index=off,metacopy=off" "$APT_M"
  mount -t proc proc "$APT_M/proc"
  mount --bind /dev "$APT_M/dev"
  mount --bind /dev/pts "$APT_M/dev/pts"
  mount --bind "$APT_CACHE" "$APT_M/var/cache/apt/archives"
  mkdir -p "$APT_M/tmp/src"
  mount --bind "$SRC" "$APT_M/tmp/src"
  cp /etc/resolv.conf "$APT_M/etc/resolv.conf"
  local env=(/usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 HOME=/root)
  chroot "$APT_M" "${env[@]}" apt-get update -qq >&2
  chroot "$APT_M" "${env[@]}" apt-get install -y -qq --no-install-recommends \
    -o APT::Keep-Downloaded-Packages=true "$@" >&2
  chroot "$APT_M" "${env[@]}" /bin/sh -euc "$after" >&2
  apt_cleanup
  trap - EXIT
  local t="$partial/tree"
  # An empty resolv.conf as the rootfs has (the pod gets its own); no apt lists, caches, logs.
  : > "$t/etc/resolv.conf"
  rm -rf "$t/tmp" "$t/root" "$t/var/lib/apt/lists" "$t/var/cache/apt" "$t/var/log" "$APT_M" "$partial/work"
  # The venv's folders belong to `user` in the packages layer; an upper copy must not take them.
  if [[ -d $t/opt/torpor/venv ]]; then chown -R 1000:1000 "$t/opt/torpor/venv"; fi
  echo "$kind $hash $(date -u +%FT%TZ)" > "$partial/done"
  rm -rf "$out"
  mv "$partial" "$out"
  echo "build-code-interpreter: $kind built in $(( $(date +%s) - start ))s, $(du -sh "$out/tree" | cut -f1)" >&2
}
LOWER_BASE="$PKG/tree:$ROOTFS"

# ---- r -----------------------------------------------------------------------------------
# The `r` language: R and IRkernel (its Jupyter kernel, spec `ir`), from Debian.
R_HASH=$( { echo "$BASE_HASH"; sed -n '/^# ---- apt layers/,/^# ---- java/p' "$0"; } | sha256sum | cut -c1-16)
# The kernel's code is a file (-f), not -e: R writes -e expressions to a temporary file it
# deletes and keeps open, and CRIU refuses to keep the memory of a tree holding a deleted file.
apt_layer code-interpreter-r "$R_HASH" "$LOWER_BASE" '
  mkdir -p /opt/torpor/r
  echo "IRkernel::main()" > /opt/torpor/r/irkernel.R
  chmod 0644 /opt/torpor/r/irkernel.R
  spec=/opt/torpor/venv/share/jupyter/kernels/ir
  mkdir -p "$spec"
  cat > "$spec/kernel.json" <<JSON
{
  "argv": ["/usr/bin/R", "--no-save", "--no-restore", "--slave", "-f", "/opt/torpor/r/irkernel.R", "--args", "{connection_file}"],
  "display_name": "R",
  "language": "R"
}
JSON
  /usr/bin/Rscript -e "library(IRkernel)"
' r-base-core r-cran-irkernel
publish code-interpreter-r "$R_HASH"

# ---- java --------------------------------------------------------------------------------
# The `java` language: OpenJDK 17 and torpor's own kernel (deploy/code-interpreter/java: an
# ipykernel kernel driving a JVM that runs the cells with JShell), compiled here.
JAVA_SRC="$SRC/java"
JAVA_HASH=$( { echo "$R_HASH"; find "$JAVA_SRC" -type f | LC_ALL=C sort | xargs cat; sed -n '/^# ---- java/,/^# ---- server/p' "$0"; } | sha256sum | cut -c1-16)
apt_layer code-interpreter-java "$JAVA_HASH" "$CACHE/code-interpreter-r/$R_HASH/tree:$LOWER_BASE" '
  lib=/opt/torpor/java
  mkdir -p "$lib/classes"
  javac -d "$lib/classes" /tmp/src/java/TorporJShell.java
  cp /tmp/src/java/torpor_java_kernel.py "$lib/"
  spec=/opt/torpor/venv/share/jupyter/kernels/java
  mkdir -p "$spec"
  cat > "$spec/kernel.json" <<JSON
{
  "argv": ["/opt/torpor/venv/bin/python", "/opt/torpor/java/torpor_java_kernel.py", "-f", "{connection_file}"],
  "display_name": "Java (JShell)",
  "language": "java"
}
JSON
  chmod -R u=rwX,go=rX "$lib"
' openjdk-17-jdk-headless
publish code-interpreter-java "$JAVA_HASH"

# ---- server ------------------------------------------------------------------------------
SRV_HASH=$( { find "$REPO/services/interpreter" "$SRC/ipython" "$SRC/start.sh" -type f \( -name '*.py' -o -name '*.sh' \) | LC_ALL=C sort | xargs cat; sed -n '/^# ---- server/,$p' "$0"; } | sha256sum | cut -c1-16)
SRV="$CACHE/code-interpreter-server/$SRV_HASH"
if [[ ! -f $SRV/done ]]; then
  need_root
  PARTIAL="$SRV.partial"
  rm -rf "$PARTIAL"
  LIB="$PARTIAL/tree/opt/torpor/interpreter"
  mkdir -p "$LIB/services/interpreter" "$LIB/ipython"
  : > "$LIB/services/__init__.py"
  find "$REPO/services/interpreter" -maxdepth 1 -type f -name '*.py' -exec cp {} "$LIB/services/interpreter/" \;
  cp -r "$SRC/ipython/." "$LIB/ipython/"
  install -m 0755 "$SRC/start.sh" "$LIB/start"
  chown -R 0:0 "$PARTIAL/tree"
  chmod -R u=rwX,go=rX "$PARTIAL/tree"
  echo "code-interpreter-server $SRV_HASH $(date -u +%FT%TZ)" > "$PARTIAL/done"
  rm -rf "$SRV"
  mv "$PARTIAL" "$SRV"
fi
publish code-interpreter-server "$SRV_HASH"
