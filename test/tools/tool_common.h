/*-------------------------------------------------------------------------
 *
 * tool_common.h
 *		What every C test tool (test/tools) and benchmark tool (test/bench)
 *		shares: dying with a message, strict number parsing, a table-driven
 *		command-line parser, and setting librdkafka properties, "-X
 *		PROP=VAL" lists included, so that each tool says only which options
 *		and properties it has.
 *
 * test/tools/tool_common.h
 *
 *-------------------------------------------------------------------------
 */
#ifndef TOOL_COMMON_H
#define TOOL_COMMON_H

#include <stdbool.h>
#include <stdio.h>

#include <librdkafka/rdkafka.h>

/* The exit status of fatal(): 1 unless a tool has its own (order_check). */
extern int	fatal_exit_status;

extern void fatal(const char *fmt,...) __attribute__((format(printf, 1, 2), noreturn));
extern bool parse_long(const char *s, long min, long max, long *result);
extern long option_long(const char *opt, const char *val, long min, long max);

/* What one command-line option stores, and where. */
typedef enum ToolOptKind
{
	OPT_FLAG,					/* bool *: set true, takes no value */
	OPT_STRING,					/* const char **: the value */
	OPT_LONG,					/* long *: a decimal in [min, max] */
	OPT_DOUBLE,					/* double *: a number in [min, max] */
	OPT_LIST					/* ToolList *: every value, in order */
} ToolOptKind;

/* The values of a repeatable option (OPT_LIST), such as -X PROP=VAL. */
typedef struct ToolList
{
	const char **items;
	int			n;
} ToolList;

/* One option: a table of these, ended by a NULL name, is a tool's syntax. */
typedef struct ToolOpt
{
	const char *name;
	ToolOptKind kind;
	void	   *dest;
	long		min;
	long		max;
} ToolOpt;

extern void parse_options(int argc, char **argv, int first, const ToolOpt *opts,
						  void (*usage) (FILE *out));

extern void conf_set(rd_kafka_conf_t *conf, const char *prop, const char *val);
extern void conf_set_extra(rd_kafka_conf_t *conf, const ToolList *extra);

#endif							/* TOOL_COMMON_H */
