/* A C program that uses a generated model the way blockc_model.h documents,
 * as a C API user would: test_host.py builds it (as strict C99) against the
 * emulated library of `lookup`, a model with ids i64[n] and y f32[n, 8]
 * (softmax(exp(table[ids]))), runs it, and reads what it prints: one JSON
 * object with every return code, error and output, and what the emulator
 * counted while the runs ran.
 *
 * argv: the weights file. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "blockc_model.h"

int blockc_emu_counters(char* buf, int size); /* the emulator's (cuda_emu.h) */

enum { MAX_N = 4, COLS = 8 };

static void print_string(const char* key, const char* text) {
  printf("\"%s\": \"", key);
  for (; *text; ++text) {
    if (*text == '"' || *text == '\\') putchar('\\');
    putchar(*text);
  }
  printf("\", ");
}

static void print_floats(const char* key, const float* x, int n) {
  printf("\"%s\": [", key);
  for (int i = 0; i < n; ++i) printf("%s%.9g", i ? ", " : "", x[i]);
  printf("], ");
}

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  blockc_model* m = blockc_create(argv[1]);
  printf("{");
  if (!m) {
    print_string("create_error", blockc_last_error());
    printf("\"created\": false}\n");
    return 0;
  }
  print_string("symbol", blockc_symbol_name(0));
  printf("\"no_symbol\": %s, ", blockc_symbol_name(1) == NULL ? "true" : "false");

  const long long ids_good[MAX_N] = {3, 0, 9, 1}, ids_bad[MAX_N] = {3, 12, 9, 1};
  void* ids = blockc_device_alloc(sizeof ids_good);
  void* a = blockc_device_alloc(MAX_N * COLS * sizeof(float));
  void* b = blockc_device_alloc(MAX_N * COLS * sizeof(float));
  if (!ids || !a || !b || blockc_copy_to_device(ids, ids_good, sizeof ids_good)) return 3;
  const void* in[1] = {ids};
  void* out_a[1] = {a};
  void* out_b[1] = {b};
  const long long three[1] = {3}, two[1] = {2}, five[1] = {5}, max_dims[1] = {MAX_N};
  int rc[9];
  char counters[2][512];

  rc[0] = blockc_run(m, in, out_a, three, NULL); /* nothing reserved yet */
  print_string("unreserved_error", blockc_model_error(m));
  rc[1] = blockc_reserve(m, max_dims);
  blockc_emu_counters(counters[0], sizeof counters[0]); /* every allocation is made */
  rc[2] = blockc_run(m, in, out_a, three, NULL);         /* first at n=3: captured */
  rc[2] |= blockc_run(m, in, out_a, three, NULL);        /* replayed */
  rc[3] = blockc_run(m, in, out_b, three, NULL);         /* another output: the graph updated */
  rc[4] = blockc_run(m, in, out_a, three, NULL);         /* back to `a`: updated again */
  blockc_copy_to_device(ids, ids_bad, sizeof ids_bad);
  rc[5] = blockc_run(m, in, out_a, three, NULL);         /* replayed, with an id past the table */
  print_string("bad_id_error", blockc_model_error(m));
  blockc_copy_to_device(ids, ids_good, sizeof ids_good);
  rc[6] = blockc_run(m, in, out_a, three, NULL);         /* replayed: the check starts afresh */
  float y_a[MAX_N * COLS], y_b[MAX_N * COLS], y_two[MAX_N * COLS];
  blockc_synchronize();
  blockc_copy_to_host(y_a, a, 3 * COLS * sizeof(float));
  blockc_copy_to_host(y_b, b, 3 * COLS * sizeof(float));
  rc[7] = blockc_run(m, in, out_a, two, NULL);           /* new dims: another graph */
  blockc_synchronize();
  blockc_copy_to_host(y_two, a, 2 * COLS * sizeof(float));
  rc[8] = blockc_run(m, in, out_a, five, NULL);          /* over the reservation */
  print_string("over_error", blockc_model_error(m));
  blockc_emu_counters(counters[1], sizeof counters[1]);

  printf("\"rc\": [");
  for (int i = 0; i < 9; ++i) printf("%s%d", i ? ", " : "", rc[i]);
  printf("], ");
  print_floats("y_a", y_a, 3 * COLS);
  print_floats("y_b", y_b, 3 * COLS);
  print_floats("y_two", y_two, 2 * COLS);
  printf("\"arena_bytes\": %zu, ", blockc_arena_bytes(max_dims));
  printf("\"counters_before\": %s, \"counters_after\": %s, \"created\": true}\n", counters[0], counters[1]);
  blockc_device_free(ids);
  blockc_device_free(a);
  blockc_device_free(b);
  blockc_destroy(m);
  return 0;
}
