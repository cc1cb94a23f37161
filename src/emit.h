/*-------------------------------------------------------------------------
 *
 * emit.h
 *	  What emit.c offers the rest of the extension.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_EMIT_H
#define OUTBOX_EMIT_H

#include "utils/guc.h"

extern char *outbox_default_topic;
extern int	outbox_max_payload_bytes;
extern char *outbox_dead_letter_topic;

extern const char *outbox_topic_error(const char *topic);
extern bool outbox_topic_matches_list(const char *topic, const char *patterns);
extern bool outbox_check_topic_patterns(char **newval, void **extra, GucSource source);
extern void outbox_check_text_arg(const char *name, Datum value, bool isnull);
extern void outbox_define_emit_settings(void);

#endif							/* OUTBOX_EMIT_H */
