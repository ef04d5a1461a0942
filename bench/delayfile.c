/* An nbdkit plugin for bench/remote.sh: a file export whose every request (read, write,
 * flush) is held DELAY_US microseconds before it is served, to stand for network latency
 * finer than nbdkit 1.32's delay filter can set (whole milliseconds). Run through nbdkit's cc
 * plugin, which compiles it at start (needs nbdkit-plugin-dev and a C compiler):
 *
 *   nbdkit -U sock cc bench/delayfile.c file=export.img delay_us=200
 *
 * The sleep is a nanosleep with the thread's timer slack set to 1 ns (the default 50 µs slack
 * would add up to 50 µs to every request). Requests are served in parallel, so the delay
 * overlaps across requests in flight, as network latency does. A flush is an fdatasync of
 * the file, as with the file plugin; one file descriptor serves every connection, so a flush
 * on any connection covers every write any connection had completed (multi-conn). */
#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static char *path;
static long delay_us;
static int fd = -1;

static int df_config(const char *key, const char *value) {
  if (strcmp(key, "file") == 0) {
    free(path);
    path = nbdkit_realpath(value);
    return path ? 0 : -1;
  }
  if (strcmp(key, "delay_us") == 0) {
    char *end;
    errno = 0;
    delay_us = strtol(value, &end, 10);
    if (errno || *end || delay_us < 0 || delay_us > 10000000) {
      nbdkit_error("delay_us: not a number of microseconds: %s", value);
      return -1;
    }
    return 0;
  }
  nbdkit_error("unknown parameter %s", key);
  return -1;
}

static int df_config_complete(void) {
  if (!path) {
    nbdkit_error("file= is required");
    return -1;
  }
  fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd < 0) {
    nbdkit_error("open %s: %m", path);
    return -1;
  }
  return 0;
}

static void df_unload(void) {
  if (fd >= 0) close(fd);
  free(path);
}

static void *df_open(int readonly) {
  (void)readonly;
  return NBDKIT_HANDLE_NOT_NEEDED;
}

static void hold(void) {
  if (delay_us == 0) return;
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  struct timespec ts = {delay_us / 1000000, (delay_us % 1000000) * 1000};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

static int64_t df_get_size(void *h) {
  (void)h;
  struct stat st;
  if (fstat(fd, &st) == -1) {
    nbdkit_error("fstat: %m");
    return -1;
  }
  return st.st_size;
}

static int df_can_multi_conn(void *h) { (void)h; return 1; }
static int df_can_flush(void *h) { (void)h; return 1; }
static int df_can_fua(void *h) { (void)h; return NBDKIT_FUA_NATIVE; }

static int df_pread(void *h, void *buf, uint32_t count, uint64_t offset, uint32_t flags) {
  (void)h; (void)flags;
  hold();
  char *p = buf;
  while (count > 0) {
    ssize_t r = pread(fd, p, count, offset);
    if (r == -1) { nbdkit_error("pread: %m"); return -1; }
    if (r == 0) { memset(p, 0, count); return 0; }
    p += r; count -= r; offset += r;
  }
  return 0;
}

static int df_flush(void *h, uint32_t flags) {
  (void)h; (void)flags;
  if (fdatasync(fd) == -1) { nbdkit_error("fdatasync: %m"); return -1; }
  return 0;
}

static int df_pwrite(void *h, const void *buf, uint32_t count, uint64_t offset, uint32_t flags) {
  (void)h;
  hold();
  const char *p = buf;
  while (count > 0) {
    ssize_t r = pwrite(fd, p, count, offset);
    if (r == -1) { nbdkit_error("pwrite: %m"); return -1; }
    p += r; count -= r; offset += r;
  }
  if ((flags & NBDKIT_FLAG_FUA) && fdatasync(fd) == -1) {
    nbdkit_error("fdatasync: %m");
    return -1;
  }
  return 0;
}

static int df_flush_delayed(void *h, uint32_t flags) {
  hold();
  return df_flush(h, flags);
}

static struct nbdkit_plugin plugin = {
  .name = "delayfile",
  .config = df_config,
  .config_complete = df_config_complete,
  .unload = df_unload,
  .open = df_open,
  .get_size = df_get_size,
  .can_multi_conn = df_can_multi_conn,
  .can_flush = df_can_flush,
  .can_fua = df_can_fua,
  .pread = df_pread,
  .pwrite = df_pwrite,
  .flush = df_flush_delayed,
};

NBDKIT_REGISTER_PLUGIN(plugin)
