/* rdagen.c — the command-line tool: `rdagen <command> ...` dispatches to run, emit, cache,
 * demo, ring-sim and tune (tools/cmd_*.c). Exit status: 0 success, 1 bad input (one
 * "rdagen: error: ..." line on stderr), 2 bad usage. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "err.h"
#include "gen.h"
#include "log.h"
#include "rda.h"

static const char rdagen_usage_text[] =
    "usage: rdagen <command> [arguments]\n"
    "\n"
    "commands:\n"
    "  run CONFIG --q Q.npy --k K.npy --v V.npy --o O.npy [--lse LSE.npy]\n"
    "      [--do DO.npy --dq DQ.npy --dk DK.npy --dv DV.npy] [--backend auto|cuda|emu]\n"
    "      [--ranks P] [--layout contiguous|zigzag] [--stats FILE]\n"
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
  char raw[8192], shown[4 * sizeof raw];
  rda_text_vformat(raw, sizeof raw, fmt, ap);
  /* Line breaks become blanks; other control characters (an escape sequence in a file name)
   * are shown as \xNN, never sent to the terminal. Then the whole is fitted to cap: long paths
   * shortened, never the reason cut off. */
  size_t n = 0;
  for (const unsigned char *c = (const unsigned char *)raw; *c != '\0'; c++) {
    if (*c == '\n' || *c == '\r')
      shown[n++] = ' ';
    else if (*c < 0x20 || *c == 0x7f)
      n += (size_t)snprintf(shown + n, sizeof shown - n, "\\x%02x", *c);
    else
      shown[n++] = (char)*c;
  }
  shown[n] = '\0';
  rda_text_fit(msg, cap, shown);
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
  fprintf(stderr, "rdagen: %s (try 'rdagen --help')\n", msg); /* one line, as errors are */
  return 2;
}

/* What a command printed must reach its destination: a full disk on standard output is an
 * error, not a silent success (a command that failed has printed its one error line already). */
static int rdagen_stdout_status(int rc) {
  errno = 0;
  if (fflush(stdout) == 0 && !ferror(stdout)) return rc;
  if (rc != 0) return rc;
  return rdagen_fail("cannot write to standard output: %s",
                     errno != 0 ? strerror(errno) : "a write failed");
}

/* Standard output closed under rdagen (a pipe whose reader left): one error line and exit 1,
 * as for a full disk, at the first write that finds it: not a silent death by SIGPIPE (exit
 * 141), and not a long command running on for nobody, as ignoring the signal would give.
 * Async-signal-safe; a caught signal's action is the default again in a spawned compiler. */
void rdagen_on_sigpipe(int sig) {
  (void)sig;
  static const char msg[] = "rdagen: error: cannot write to standard output: the pipe was closed\n";
  const ssize_t w = write(2, msg, sizeof msg - 1);
  (void)w;
  _exit(1);
}

int main(int argc, char **argv) {
  /* A config runs in this process: one stuck in a single Lua instruction past its time limit
   * ends it with one error line (SPEC §3: a config cannot hang the tool). */
  rda_gen_enable_watchdog("rdagen");
  struct sigaction pipe_lost;
  memset(&pipe_lost, 0, sizeof pipe_lost);
  pipe_lost.sa_handler = rdagen_on_sigpipe;
  sigemptyset(&pipe_lost.sa_mask);
  sigaction(SIGPIPE, &pipe_lost, NULL);
  (void)rda_log_level_now(); /* a misspelt RDA_LOG is said at once, whatever the command logs */
  if (argc < 2) {
    fputs(rdagen_usage_text, stderr);
    return 2;
  }
  const char *cmd = argv[1];
  if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
    fputs(rdagen_usage_text, stdout);
    return rdagen_stdout_status(0);
  }
  if (strcmp(cmd, "--version") == 0) {
    if (argc > 2) return rdagen_usage("--version takes no arguments ('%s')", argv[2]);
    const unsigned v = rda_version();
    printf("rdagen %s (librda %u.%u.%u)\n", RDA_VERSION_STRING, v / 10000, v / 100 % 100, v % 100);
    return rdagen_stdout_status(0);
  }
  static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
  } commands[] = {{"run", rdagen_cmd_run},   {"emit", rdagen_cmd_emit},
                  {"cache", rdagen_cmd_cache}, {"demo", rdagen_cmd_demo},
                  {"ring-sim", rdagen_cmd_ring_sim}, {"tune", rdagen_cmd_tune}};
  for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
    if (strcmp(cmd, commands[i].name) == 0)
      return rdagen_stdout_status(commands[i].run(argc - 2, argv + 2));
  return rdagen_usage("unknown command '%s' (expected run, emit, cache, demo, ring-sim or tune)",
                      cmd);
}
