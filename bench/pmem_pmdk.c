/*
 * PMDK libpmemobj transactions, the peer of tally-pmem's log in bench/pmem.sh: each
 * transaction snapshots one `size`-byte slot (pmemobj_tx_add_range: undo log) and overwrites
 * it, as a libpmemobj program updates persistent data in place. Slots rotate through the
 * root object. Prints one JSON object, like crates/tally-pmem/examples/pmem_bench.rs.
 *
 *   pmem_pmdk POOL SIZE TXS RUN
 */
#include <libpmemobj.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SLOTS 256

static uint64_t now_ns(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b) {
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int update(PMEMobjpool *pop, PMEMoid root, char *base, size_t size, size_t i,
		  char *src) {
	size_t off = (i % SLOTS) * size;
	memcpy(src, &i, size < sizeof i ? size : sizeof i);
	int failed = 0;
	TX_BEGIN(pop) {
		pmemobj_tx_add_range(root, off, size);
		memcpy(base + off, src, size);
	} TX_ONABORT {
		failed = 1;
	} TX_END
	return failed;
}

int main(int argc, char **argv) {
	if (argc != 5) {
		fprintf(stderr, "usage: %s POOL SIZE TXS RUN\n", argv[0]);
		return 2;
	}
	const char *path = argv[1];
	size_t size = strtoull(argv[2], NULL, 10);
	size_t txs = strtoull(argv[3], NULL, 10);
	int run = atoi(argv[4]);
	PMEMobjpool *pop = pmemobj_create(path, "tally-bench", 64u << 20, 0600);
	if (pop == NULL) {
		fprintf(stderr, "pmemobj_create %s: %s\n", path, pmemobj_errormsg());
		return 1;
	}
	PMEMoid root = pmemobj_root(pop, SLOTS * size);
	if (OID_IS_NULL(root)) {
		fprintf(stderr, "pmemobj_root: %s\n", pmemobj_errormsg());
		return 1;
	}
	char *base = pmemobj_direct(root);
	char *src = calloc(1, size);
	uint64_t *lat = malloc(txs * sizeof *lat);
	if (src == NULL || lat == NULL)
		return 1;
	for (size_t i = 0; i < txs / 10; i++) /* warm-up, as the Rust side */
		if (update(pop, root, base, size, i, src))
			return 1;
	uint64_t start = now_ns();
	for (size_t i = 0; i < txs; i++) {
		uint64_t t = now_ns();
		if (update(pop, root, base, size, i, src)) {
			fprintf(stderr, "transaction aborted: %s\n", pmemobj_errormsg());
			return 1;
		}
		lat[i] = now_ns() - t;
	}
	uint64_t total = now_ns() - start;
	qsort(lat, txs, sizeof *lat, cmp_u64);
	printf("{\"system\":\"libpmemobj\",\"size\":%zu,\"run\":%d,\"txs\":%zu,"
	       "\"ns_per_tx\":%.1f,\"tx_per_s\":%.0f,\"p50_ns\":%llu,\"p99_ns\":%llu,"
	       "\"fences_per_tx\":null,\"lines_per_tx\":null}\n",
	       size, run, txs, (double)total / txs, txs * 1e9 / total,
	       (unsigned long long)lat[(txs - 1) / 2],
	       (unsigned long long)lat[(size_t)((txs - 1) * 0.99)]);
	pmemobj_close(pop);
	free(src);
	free(lat);
	return 0;
}
