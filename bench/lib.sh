# Shell helpers shared by the bench scripts (sourced, not run).

# cleanup_work: unmount everything mounted under $WORK (deepest first, lazily), detach every
# loop device backed by a file under it, and remove it. Safe to call twice; meant for
# `trap cleanup_work EXIT`, the second line of defence when a run is killed.
cleanup_work() {
  for m in $(awk -v w="$WORK" 'index($2, w) == 1 {print $2}' /proc/mounts | sort -r); do
    umount -l "$m" 2>/dev/null || true
  done
  for l in $(losetup -nO NAME,BACK-FILE | awk -v w="$WORK" 'index($2, w) == 1 {print $1}'); do
    losetup -d "$l" 2>/dev/null || true
  done
  rm -rf "$WORK"
}

# make_tree COPIES: $WORK/tree holding COPIES copies of this repository's tree (`git archive
# HEAD`), the same as a tarball in $WORK/tree.tar, and an empty $WORK/mnt. The caller counts
# what it needs in $WORK/tree, then removes it or makes a repository of it.
make_tree() {
  mkdir -p "$WORK/tree" "$WORK/mnt"
  git -C "$ROOT" archive --format=tar HEAD >"$WORK/one.tar"
  for i in $(seq "$1"); do
    mkdir "$WORK/tree/copy$i"
    tar -xf "$WORK/one.tar" -C "$WORK/tree/copy$i"
  done
  tar -cf "$WORK/tree.tar" -C "$WORK/tree" .
}
