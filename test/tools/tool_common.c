/*-------------------------------------------------------------------------
 *
 * tool_common.c
 *		Helpers shared by the C test and benchmark tools (see tool_common.h):
 *		one fatal(), one strict number parser, one option parser and one way
 *		to apply "-X PROP=VAL" librdkafka properties, instead of a copy in
 *		each tool.
 *
 * test/tools/tool_common.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include "tool_common.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

int			fatal_exit_status = 1;

/* Print "<program>: <message>" and exit with fatal_exit_status. */
void
fatal(const char *fmt,...)
{
	va_list		ap;

	fprintf(stderr, "%s: ", program_invocation_short_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(fatal_exit_status);
}

/*
 * Strictly parse a decimal integer within [min, max].  Returns false on
 * junk, overflow or out-of-range values.
 */
bool
parse_long(const char *s, long min, long max, long *result)
{
	char	   *end;
	long		val;

	if (s == NULL || *s == '\0')
		return false;
	errno = 0;
	val = strtol(s, &end, 10);
	if (errno != 0 || *end != '\0' || val < min || val > max)
		return false;
	*result = val;
	return true;
}

/* Parse a decimal option value within [min, max], or die naming the option. */
long
option_long(const char *opt, const char *val, long min, long max)
{
	long		n;

	if (!parse_long(val, min, max, &n))
		fatal("invalid %s \"%s\"", opt, val);
	return n;
}

/* Parse a number option value within [min, max], or die naming the option. */
static double
option_double(const char *opt, const char *val, long min, long max)
{
	char	   *end;
	double		d;

	errno = 0;
	d = strtod(val, &end);
	if (errno || end == val || *end || d < min || d > max)
		fatal("invalid %s \"%s\"", opt, val);
	return d;
}

/* Store one option's value where its table entry says. */
static void
store_option(const ToolOpt *o, const char *val, int argc)
{
	ToolList   *list;

	switch (o->kind)
	{
		case OPT_FLAG:
			*(bool *) o->dest = true;
			break;
		case OPT_STRING:
			*(const char **) o->dest = val;
			break;
		case OPT_LONG:
			*(long *) o->dest = option_long(o->name, val, o->min, o->max);
			break;
		case OPT_DOUBLE:
			*(double *) o->dest = option_double(o->name, val, o->min, o->max);
			break;
		case OPT_LIST:
			list = (ToolList *) o->dest;
			/* argc bounds how many values any option can have */
			if (list->items == NULL &&
				(list->items = calloc((size_t) argc, sizeof(char *))) == NULL)
				fatal("out of memory");
			list->items[list->n++] = val;
			break;
	}
}

/*
 * Parse argv[first..] by the table opts (ended by a NULL name): --help
 * prints usage (when given) and exits 0; an unknown option or a missing
 * value dies with a message.
 */
void
parse_options(int argc, char **argv, int first, const ToolOpt *opts,
			  void (*usage) (FILE *out))
{
	for (int i = first; i < argc; i++)
	{
		const char *arg = argv[i];
		const ToolOpt *o;

		if (usage != NULL && strcmp(arg, "--help") == 0)
		{
			usage(stdout);
			exit(0);
		}
		for (o = opts; o->name != NULL && strcmp(o->name, arg) != 0; o++)
			;
		if (o->name == NULL)
			fatal("unknown option \"%s\" (try --help)", arg);
		if (o->kind != OPT_FLAG && i + 1 >= argc)
			fatal("option %s needs an argument (try --help)", arg);
		store_option(o, o->kind == OPT_FLAG ? NULL : argv[++i], argc);
	}
}

/* Set one librdkafka property or die. */
void
conf_set(rd_kafka_conf_t *conf, const char *prop, const char *val)
{
	char		errstr[512];

	if (rd_kafka_conf_set(conf, prop, val, errstr, sizeof(errstr)) != RD_KAFKA_CONF_OK)
		fatal("%s", errstr);
}

/* Set every "PROP=VAL" of a -X list, in order (so later ones win), or die. */
void
conf_set_extra(rd_kafka_conf_t *conf, const ToolList *extra)
{
	for (int i = 0; i < extra->n; i++)
	{
		char	   *prop = strdup(extra->items[i]);
		char	   *eq = prop ? strchr(prop, '=') : NULL;

		if (eq == NULL)
			fatal("-X wants PROP=VAL, got \"%s\"", extra->items[i]);
		*eq = '\0';
		conf_set(conf, prop, eq + 1);
		free(prop);
	}
}
