/*-------------------------------------------------------------------------
 *
 * emit.h
 *	  What emit.c offers the rest of the extension.
 *
 *-------------------------------------------------------------------------
 */
#ifndef OUTBOX_EMIT_H
#define OUTBOX_EMIT_H

extern char *outbox_default_topic;
extern int	outbox_max_payload_bytes;
extern char *outbox_dead_letter_topic;

extern const char *outbox_topic_error(const char *topic);
extern void outbox_define_emit_settings(void);

#endif							/* OUTBOX_EMIT_H */
