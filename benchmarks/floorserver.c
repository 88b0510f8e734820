/* The floor of any /metrics server on this machine, for bench_scrapers.py: it answers
 * every GET on 127.0.0.1:<port> with the bytes of <file> as a gzip-encoded body, one
 * thread a keep-alive connection, and does nothing else (no rendering, no interpreter).
 * What 50 clients at once cost beside it is the box's, not a server's.
 * Usage: floorserver <file> <port>; built by the benchmark with the system's cc. */
#define _GNU_SOURCE
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static char *body;
static long body_len;

static int send_all(int fd, const char *p, long n) {
    while (n > 0) {
        long w = write(fd, p, n);
        if (w <= 0) return -1;
        p += w;
        n -= w;
    }
    return 0;
}

static void *serve(void *arg) {
    int fd = (int)(long)arg;
    char buf[16384];
    long have = 0;
    char head[256];
    int head_len = snprintf(head, sizeof head,
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\n"
                            "Content-Encoding: gzip\r\nContent-Length: %ld\r\n\r\n", body_len);
    for (;;) {
        char *end = NULL;
        while ((end = memmem(buf, have, "\r\n\r\n", 4)) == NULL) {
            if (have == sizeof buf) goto done;  /* a request head this large is no scrape */
            long n = read(fd, buf + have, sizeof buf - have);
            if (n <= 0) goto done;
            have += n;
        }
        long used = end + 4 - buf;
        memmove(buf, buf + used, have - used);
        have -= used;
        if (send_all(fd, head, head_len) || send_all(fd, body, body_len)) goto done;
    }
done:
    close(fd);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: floorserver FILE PORT\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "rb");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    body_len = ftell(f);
    rewind(f);
    body = malloc(body_len ? body_len : 1);
    if (fread(body, 1, body_len, f) != (size_t)body_len) return 1;
    fclose(f);
    int s = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(atoi(argv[2]));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(s, (struct sockaddr *)&addr, sizeof addr) || listen(s, 512)) {
        perror("listen");
        return 1;
    }
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0) continue;
        pthread_t t;
        if (pthread_create(&t, NULL, serve, (void *)(long)c) == 0) pthread_detach(t);
        else close(c);
    }
}
