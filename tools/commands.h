/* commands.h — the subcommands of rdagen. Each returns the process exit status:
 * 0 success, 1 bad input (after printing one "rdagen: error: ..." line), 2 bad usage. */
#ifndef RDAGEN_COMMANDS_H
#define RDAGEN_COMMANDS_H

int rdagen_cmd_run(int argc, char **argv);   /* tools/cmd_run.c */
int rdagen_cmd_emit(int argc, char **argv);  /* tools/cmd_emit.c */
int rdagen_cmd_demo(int argc, char **argv);  /* tools/cmd_demo.c */
int rdagen_cmd_cache(int argc, char **argv); /* tools/cmd_cache.c */
int rdagen_cmd_ring_sim(int argc, char **argv); /* tools/cmd_ring_sim.c */
int rdagen_cmd_tune(int argc, char **argv); /* tools/cmd_tune.c */

/* Print "rdagen: error: <msg>" on stderr and return 1. */
int rdagen_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "rdagen: <msg>" plus a usage hint on stderr and return 2. */
int rdagen_usage(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* SIGPIPE's action in rdagen: "rdagen: error: cannot write to standard output: ..." and
 * _exit(1) (tools/rdagen.c). */
void rdagen_on_sigpipe(int sig);

#endif
