/* rdagen.c — the command-line tool: `rdagen <command> ...` dispatches to run, emit, cache,
 * demo, ring-sim and tune (tools/cmd_*.c). Exit status: 0 success, 1 bad input (one
 * "rdagen: error: ..." line on stderr), 2 bad usage. */
#include "commands.h"

#include "gen.h"
#include "rda.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static const char rdagen_usage_text[] =
    "usage: rdagen <command> [arguments]\n"
    "\n"
    "commands:\n"
    "  run CONFIG --q Q.npy --k K.npy --v V.npy --o O.npy [--lse LSE.npy]\n"
    "      [--do DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy] [--backend auto|cuda|emu]\n"
    "      [--ranks P]\n"
    "      dilated attention on .npy files (SPEC section 4)\n"
    "  emit CONFIG --arch sm_XX [--arch sm_YY ...] --out DIR [--ptx]\n"
    "      write each planned kernel's CUDA source, cubin and manifest.json\n"
    "  cache list|clear [--arch TARGET] | cache warm CONFIG --arch sm_XX ...\n"
    "      show, empty or fill the kernel cache (rdagen cache --help)\n"
    "  demo [CONFIG] [--n N] [--batch B] [--backend auto|cuda|emu] [--seed S]\n"
    "      generate, compile, run and check the kernels of a config; print a table\n"
    "  ring-sim CONFIG --n N --ranks P [--layout contiguous|zigzag] [--link-gbps B]\n"
    "      [--tflops F] [--json]\n"
    "      predict the ring's bytes, memory and time per rank (no kernels run)\n"
    "  tune CONFIG [--n N] [--batch B] [--backward] [--iters K] [--verify-n N]\n"
    "      [--backend auto|cuda|emu] [--seed S] [--db FILE] [--dry-run] [--wgmma]\n"
    "      time every candidate tile of the config's kernels; rank them in the tuning\n"
    "      database that plans read (rdagen tune --help)\n"
    "\n"
    "options:\n"
    "  --help      this text\n"
    "  --version   the version of rdagen and librda\n"
    "\n"
    "exit status: 0 success, 1 bad input, 2 bad usage\n";

/* Format a message into msg as exactly one line, whatever it holds. */
static void rdagen_one_line(char *msg, size_t cap, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
static void rdagen_one_line(char *msg, size_t cap, const char *fmt, va_list ap) {
  vsnprintf(msg, cap, fmt, ap);
  for (char *c = msg; *c; c++)
    if (*c == '\n' || *c == '\r') *c = ' ';
}

int rdagen_fail(const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  rdagen_one_line(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "rdagen: error: %s\n", msg);
  return 1;
}

int rdagen_usage(const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  rdagen_one_line(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "rdagen: %s\nTry 'rdagen --help' for more information.\n", msg);
  return 2;
}

int main(int argc, char **argv) {
  /* A config runs in this process: one stuck in a single Lua instruction past its time limit
   * ends it with one error line (SPEC §3: a config cannot hang the tool). */
  rda_gen_enable_watchdog("rdagen");
  if (argc < 2) {
    fputs(rdagen_usage_text, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(rdagen_usage_text, stdout);
    return 0;
  }
  if (strcmp(cmd, "--version") == 0) {
    const unsigned v = rda_version();
    printf("rdagen %s (librda %u.%u.%u)\n", RDA_VERSION_STRING, v / 10000, v / 100 % 100, v % 100);
    return 0;
  }
  if (strcmp(cmd, "run") == 0) return rdagen_cmd_run(argc - 2, argv + 2);
  if (strcmp(cmd, "emit") == 0) return rdagen_cmd_emit(argc - 2, argv + 2);
  if (strcmp(cmd, "cache") == 0) return rdagen_cmd_cache(argc - 2, argv + 2);
  if (strcmp(cmd, "demo") == 0) return rdagen_cmd_demo(argc - 2, argv + 2);
  if (strcmp(cmd, "ring-sim") == 0) return rdagen_cmd_ring_sim(argc - 2, argv + 2);
  if (strcmp(cmd, "tune") == 0) return rdagen_cmd_tune(argc - 2, argv + 2);
  return rdagen_usage("unknown command '%s' (expected run, emit, cache, demo, ring-sim or tune)",
                      cmd);
}
