/* The LMDB peer of the multi-file atomic commit (issue #6 workload 5): one environment with N
 * named databases (LMDB has no multi-file transaction; one environment is its atomic unit),
 * each commit puts one value into each database, durably (mdb_txn_commit syncs: no MDB_NOSYNC).
 * Built and run by bench/run.sh; prints one JSON object.
 *
 *   lmdb_commit DIR N SECONDS VALUE_BYTES
 */
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

#define KEYS 256

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec / 1e9;
}

static double cpu(void) {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_utime.tv_usec / 1e6 + u.ru_stime.tv_sec + u.ru_stime.tv_usec / 1e6;
}

#define CHECK(call)                                                            \
  do {                                                                         \
    int rc_ = (call);                                                          \
    if (rc_ != 0) {                                                            \
      fprintf(stderr, "lmdb_commit: %s: %s\n", #call, mdb_strerror(rc_));      \
      return 1;                                                                \
    }                                                                          \
  } while (0)

int main(int argc, char **argv) {
  if (argc != 5) {
    fprintf(stderr, "usage: lmdb_commit DIR N SECONDS VALUE_BYTES\n");
    return 2;
  }
  const char *dir = argv[1];
  int n = atoi(argv[2]);
  double seconds = atof(argv[3]);
  size_t value_bytes = (size_t)atol(argv[4]);
  if (n < 1 || n > 64 || seconds <= 0 || value_bytes < 8) {
    fprintf(stderr, "lmdb_commit: N 1..64, SECONDS > 0, VALUE_BYTES >= 8\n");
    return 2;
  }
  unsigned char *value = malloc(value_bytes);
  if (!value) return 1;
  for (size_t i = 0; i < value_bytes; i++) value[i] = (unsigned char)(i * 131 + 7);

  MDB_env *env;
  CHECK(mdb_env_create(&env));
  CHECK(mdb_env_set_maxdbs(env, (MDB_dbi)n));
  CHECK(mdb_env_set_mapsize(env, (size_t)1 << 30));
  CHECK(mdb_env_open(env, dir, 0, 0644));
  MDB_dbi dbi[64];
  MDB_txn *txn;
  CHECK(mdb_txn_begin(env, NULL, 0, &txn));
  for (int i = 0; i < n; i++) {
    char name[16];
    snprintf(name, sizeof name, "db%d", i);
    CHECK(mdb_dbi_open(txn, name, MDB_CREATE | MDB_INTEGERKEY, &dbi[i]));
  }
  CHECK(mdb_txn_commit(txn));

  double cpu0 = cpu(), start = now(), elapsed = 0;
  unsigned long long commits = 0;
  while ((elapsed = now() - start) < seconds) {
    memcpy(value, &commits, sizeof commits); /* fresh bytes every commit */
    CHECK(mdb_txn_begin(env, NULL, 0, &txn));
    for (int i = 0; i < n; i++) {
      size_t k = commits % KEYS;
      MDB_val key = {sizeof k, &k}, val = {value_bytes, value};
      CHECK(mdb_put(txn, dbi[i], &key, &val, 0));
    }
    CHECK(mdb_txn_commit(txn));
    commits++;
  }
  elapsed = now() - start;
  double cpu_s = cpu() - cpu0;
  mdb_env_close(env);
  printf("{\"ops\": %llu, \"seconds\": %.6f, \"cpu_s\": %.6f}\n", commits, elapsed, cpu_s);
  free(value);
  return 0;
}
