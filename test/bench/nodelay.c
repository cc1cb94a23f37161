/*-------------------------------------------------------------------------
 *
 * nodelay.c
 *		LD_PRELOAD shim: TCP_NODELAY on every accepted TCP connection.
 *
 * librdkafka's mock cluster (2.0.2, used by test/tools/mock_kafka) never
 * disables Nagle's algorithm on the connections its brokers accept; a real
 * Kafka broker does (SocketServer: setTcpNoDelay(true)).  librdkafka sends
 * one ProduceRequest per partition, so a batch that spans several
 * partitions led by one broker gets several small responses written back
 * to back, and Nagle holds each one after the first until the client's
 * delayed ACK (about 40 ms on Linux).  Every such batch then waits ~40 ms
 * for its acknowledgements on a loopback broker, which is an artefact of
 * the mock, not of Kafka.  test/bench/run.sh starts the mock with this
 * shim (LD_PRELOAD=test/bench/nodelay.so) unless BENCH_MOCK_NAGLE=1, and
 * reports a few figures both ways.
 *
 * test/bench/nodelay.c
 *
 *-------------------------------------------------------------------------
 */
#define _GNU_SOURCE

#include <dlfcn.h>
#include <stddef.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

static void
set_nodelay(int fd)
{
	struct sockaddr_storage ss;
	socklen_t	len = sizeof(ss);
	int			on = 1;

	if (fd < 0)
		return;
	if (getsockname(fd, (struct sockaddr *) &ss, &len) == 0 &&
		(ss.ss_family == AF_INET || ss.ss_family == AF_INET6))
		(void) setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, sizeof(on));
}

int
accept(int s, struct sockaddr *addr, socklen_t *addrlen)
{
	static int	(*real_accept) (int, struct sockaddr *, socklen_t *);
	int			fd;

	if (real_accept == NULL)
		real_accept = (int (*) (int, struct sockaddr *, socklen_t *)) dlsym(RTLD_NEXT, "accept");
	fd = real_accept(s, addr, addrlen);
	set_nodelay(fd);
	return fd;
}

int
accept4(int s, struct sockaddr *addr, socklen_t *addrlen, int flags)
{
	static int	(*real_accept4) (int, struct sockaddr *, socklen_t *, int);
	int			fd;

	if (real_accept4 == NULL)
		real_accept4 = (int (*) (int, struct sockaddr *, socklen_t *, int)) dlsym(RTLD_NEXT, "accept4");
	fd = real_accept4(s, addr, addrlen, flags);
	set_nodelay(fd);
	return fd;
}
