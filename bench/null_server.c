/* The load generator's ceiling in bench/kv_large.py: the cheapest server that still does a server's work.
 *
 * It speaks just enough RESP for the bench: every request is an array of bulk strings. A GET is answered with
 * one preallocated, page-aligned (and huge-page advised, as the servers' large values are) bulk reply of the
 * size given, sent without blocking and waiting for room as the servers do. Any other command (the bench's SET)
 * has its arguments received into memory, a value straight into a reused buffer as a real server's would,
 * and is answered +OK. A GET of a key starting "probe:" gets 100 bytes: the bench's small GET on a connection of
 * its own, whose latency here is what the machine alone adds. One thread per connection, no parsing beyond that
 * and no storage, so what the client reaches against it is what the client and the kernel allow, not what a
 * server adds.
 *
 * Given a key count it is the store's ceiling instead: the cheapest server that keeps what it is sent. Each key of
 * the bench's key space ("bench:<n>") owns one slot, made and faulted in at the start, holding its GET reply
 * (header, value, CRLF) back to back from a page boundary; a SET receives its value in place into its key's slot
 * (the value lands as far into its page as its header is long, as the KV server's large values do), and a GET
 * sends the key's slot. So its memory is a key space as large as the servers', cold in the caches as theirs is,
 * and it copies each value once, as they do, but allocates nothing, keeps no index and makes no SET atomic: a
 * real store can only be slower, and what the client reaches against it is as far as any server could go here.
 *
 *     null_server <value-bytes> [keys]   listens on 127.0.0.1, an ephemeral port, and prints "port <n>"
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

static char *reply;
static size_t reply_len, head_len;
static char *slots; /* with a key count: one reply_len slot per key, each starting on a page */
static size_t slot_stride;
static long slot_count;
static const char key_prefix[] = "bench:";
static const char probe_prefix[] = "probe:"; /* the bench's small GET on its own connection */
static const char probe_reply[] = "$100\r\n"
                                  "0123456789012345678901234567890123456789012345678901234567890123456789"
                                  "012345678901234567890123456789\r\n";

struct conn {
    int fd;
    char buf[65536];
    size_t pos, end;
    char *scratch;
    size_t scratch_len;
};

static int fill(struct conn *c) {
    if (c->pos == c->end) c->pos = c->end = 0;
    ssize_t n = recv(c->fd, c->buf + c->end, sizeof c->buf - c->end, 0);
    if (n <= 0) return -1;
    c->end += (size_t)n;
    return 0;
}

/* A line ending in CRLF, NUL-terminated in place; NULL when the peer is gone or the line is too long. */
static char *read_line(struct conn *c) {
    for (;;) {
        char *nl = memchr(c->buf + c->pos, '\n', c->end - c->pos);
        if (nl) {
            char *line = c->buf + c->pos;
            *nl = 0;
            c->pos = (size_t)(nl - c->buf) + 1;
            return line;
        }
        if (c->pos) { /* move the partial line to the front */
            memmove(c->buf, c->buf + c->pos, c->end - c->pos);
            c->end -= c->pos;
            c->pos = 0;
        }
        if (c->end == sizeof c->buf || fill(c)) return NULL;
    }
}

/* The socket's low-water mark while `rest` bytes of a value are still to come: the schedule the KV server uses for
 * a value arriving alone (kvserver/strata_kv/server/intake.py, `wake_at`): at most 4 MiB, and for the last 4 MiB half
 * of what is left, down to 256 KiB. Woken per packet instead (a blocking recv with MSG_WAITALL), this server
 * took 115-129 ms of CPU per GB of one client's 4 MiB SETs against 71-81 with the mark, and the client reached
 * 3.39-3.52 GB/s against 4.03-4.50 in three of four alternations on a quiet stretch (3.16 against 2.76 in the
 * other), below the KV server itself in the same rounds (3.79-4.19): a ceiling that was not one. */
static int wake_at(size_t rest) {
    size_t want = rest < 4194304 ? rest : 4194304;
    if (want == rest && want > 262144) want = rest / 2 > 262144 ? rest / 2 : 262144;
    return (int)want;
}

/* Receive n bytes into dst: what is buffered first, the rest straight from the socket, woken as `wake_at` says. */
static int read_exact(struct conn *c, char *dst, size_t n) {
    size_t have = c->end - c->pos < n ? c->end - c->pos : n;
    memcpy(dst, c->buf + c->pos, have);
    c->pos += have;
    int mark = 1, failed = 0;
    while (have < n) {
        ssize_t got = recv(c->fd, dst + have, n - have, MSG_DONTWAIT);
        if (got > 0) {
            have += (size_t)got;
            continue;
        }
        if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
            failed = 1;
            break;
        }
        int want = wake_at(n - have);
        if (want != mark && !setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want)) mark = want;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, -1) < 0 && errno != EINTR) {
            failed = 1;
            break;
        }
    }
    if (mark != 1) { /* the next line is read with a plain recv, which must wake at its first byte */
        int one = 1;
        setsockopt(c->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    }
    return failed ? -1 : 0;
}

static int send_all(int fd, const char *data, size_t n) {
    while (n) {
        ssize_t sent = send(fd, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent < 0 && errno == EAGAIN) {
            struct pollfd p = {.fd = fd, .events = POLLOUT};
            poll(&p, 1, -1);
            continue;
        }
        if (sent <= 0) return -1;
        data += sent;
        n -= (size_t)sent;
    }
    return 0;
}

static void *serve(void *arg) {
    struct conn *c = arg;
    char first[16];
    int probe;
    char *slot;
    for (;;) {
        char *line = read_line(c);
        if (!line || line[0] != '*') break;
        long args = strtol(line + 1, NULL, 10);
        first[0] = 0;
        probe = 0;
        slot = NULL;
        for (long i = 0; i < args; i++) {
            line = read_line(c);
            if (!line || line[0] != '$') goto done;
            size_t len = (size_t)strtol(line + 1, NULL, 10) + 2; /* with its CRLF */
            if (i == 2 && slot && len == reply_len - head_len) { /* a SET's value, in place into its key's slot */
                if (read_exact(c, slot + head_len, len)) goto done;
                continue;
            }
            if (len > c->scratch_len) {
                free(c->scratch);
                c->scratch = malloc(len);
                c->scratch_len = c->scratch ? len : 0;
                if (!c->scratch) goto done;
            }
            if (read_exact(c, c->scratch, len)) goto done;
            if (i == 0) snprintf(first, sizeof first, "%.*s", (int)(len - 2 < 15 ? len - 2 : 15), c->scratch);
            if (i == 1) probe = len - 2 >= sizeof probe_prefix - 1 && !memcmp(c->scratch, probe_prefix, sizeof probe_prefix - 1);
            if (i == 1 && slots && len - 2 > sizeof key_prefix - 1 && !memcmp(c->scratch, key_prefix, sizeof key_prefix - 1))
                slot = slots + (strtoul(c->scratch + sizeof key_prefix - 1, NULL, 10) % (size_t)slot_count) * slot_stride; /* any key, even "-1", lands in a slot */
        }
        int failed;
        if (strcasecmp(first, "GET") != 0)
            failed = send_all(c->fd, "+OK\r\n", 5);
        else if (probe)
            failed = send_all(c->fd, probe_reply, sizeof probe_reply - 1);
        else
            failed = send_all(c->fd, slot ? slot : reply, reply_len);
        if (failed) break;
    }
done:
    close(c->fd);
    free(c->scratch);
    free(c);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s <value-bytes> [keys]\n", argv[0]);
        return 2;
    }
    size_t size = (size_t)strtoull(argv[1], NULL, 10);
    slot_count = argc == 3 ? strtol(argv[2], NULL, 10) : 0;
    char head[32];
    head_len = (size_t)snprintf(head, sizeof head, "$%zu\r\n", size);
    reply_len = head_len + size + 2;
    slot_stride = (reply_len + 4095) & ~(size_t)4095;
    long replies = slot_count > 0 ? slot_count : 1;
    char *memory = mmap(NULL, slot_stride * (size_t)replies, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) return 1;
    madvise(memory, slot_stride * (size_t)replies, MADV_HUGEPAGE); /* as the servers' own large values */
    for (long i = 0; i < replies; i++) { /* every page faulted in, as a filled store's are */
        char *r = memory + (size_t)i * slot_stride;
        memset(r, 0, reply_len);
        memcpy(r, head, head_len);
        memcpy(r + reply_len - 2, "\r\n", 2);
    }
    reply = memory;
    if (slot_count > 0) slots = memory;

    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t addr_len = sizeof addr;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) || listen(lfd, 128) ||
        getsockname(lfd, (struct sockaddr *)&addr, &addr_len)) {
        perror("null_server");
        return 1;
    }
    printf("port %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        struct conn *c = calloc(1, sizeof *c);
        pthread_t thread;
        if (!c) {
            close(fd);
            continue;
        }
        c->fd = fd;
        if (pthread_create(&thread, NULL, serve, c)) {
            close(fd);
            free(c);
            continue;
        }
        pthread_detach(thread);
    }
}
