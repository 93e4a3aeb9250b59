/* args.h — the strict number and option-value syntax every rdagen subcommand shares, so that
 * one spelling means the same everywhere and anything else is bad usage (exit 2). */
#ifndef RDAGEN_ARGS_H
#define RDAGEN_ARGS_H

/* A count in plain decimal digits: no sign, space, base prefix or suffix; in [lo, hi].
 * 1 when it is one, 0 otherwise (*out untouched). */
int rdagen_parse_count(const char *s, long long lo, long long hi, long long *out);

/* A count as above, or in decimal scientific notation of an integral value (1e9, 2.5E3,
 * 1e+6); in [lo, hi]. */
int rdagen_parse_count_sci(const char *s, long long lo, long long hi, long long *out);

/* A finite decimal number: digits with an optional fraction and exponent (0.5, 12, .25, 3e-2);
 * no sign, space, hex, inf or nan. 1 when it is one, 0 otherwise. */
int rdagen_parse_decimal(const char *s, double *out);

/* A GPU architecture written sm_XX or sm_XXX (digits only, at least sm_10): its number XX,
 * or -1. */
int rdagen_parse_arch(const char *s);

/* The index in names[0..n) (option names without the "--") of arg when it is "--NAME" or
 * "--NAME=VALUE" (*eq then points at the '=', else is NULL); -1 when it is neither. */
int rdagen_option_index(const char *arg, const char *const *names, int n, const char **eq);

/* The value of option argv[*i] (whose name ends at eq when it is "--name=value", eq NULL
 * otherwise): after the '=', or the next argument, which may not be empty or begin with "--"
 * (then the option has no value: NULL). Moves *i past a separate value. */
const char *rdagen_option_value(int argc, char **argv, int *i, const char *eq);

#endif
