/* probe: a tiny static test tool for the one-node cluster's tests (tests/cluster), built into the image
 * localhost/eagle3-node/probe by scripts/build-pause-image.sh. No registry is reachable here, so there is no
 * busybox to pull: this program is the pods' shell, web server and HTTP client. Statically linked with glibc,
 * whose getaddrinfo needs NSS modules at run time that an image FROM scratch lacks, so it has its own small DNS
 * client (A records over UDP, with resolv.conf's nameserver, search and ndots, as kubelet writes them).
 *
 *   probe echo WORDS...              print WORDS
 *   probe sleep SECONDS              sleep
 *   probe exit CODE                  exit with CODE
 *   probe serve PORT TEXT            an HTTP/1.0 server on 0.0.0.0:PORT answering TEXT to every request
 *   probe get URL [DEADLINE_S]       GET http://HOST[:PORT][/PATH], retried until a 2xx or the deadline
 *                                    (default 20 s); prints the body; exit 0 on a 2xx
 *   probe resolve NAME [DEADLINE_S]  print NAME's IPv4 addresses; exit 0 if there is one (retried until the
 *                                    deadline, default 0: one try)
 *   probe connect HOST PORT [TIMEOUT_S]  one TCP connect: exit 0 connected, 1 refused/unreachable, 2 timed out
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#define MAX_ADDRS 16

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- DNS ---------------------------------------------------------------------------------------------- */

struct resolv {
    struct in_addr ns[3];
    int nns;
    char search[6][256];
    int nsearch;
    int ndots;
};

static void read_resolv(struct resolv *r) {
    memset(r, 0, sizeof *r);
    r->ndots = 1;
    FILE *f = fopen("/etc/resolv.conf", "r");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        char *save = NULL, *key = strtok_r(line, " \t\r\n", &save);
        if (!key || key[0] == '#' || key[0] == ';') continue;
        if (strcmp(key, "nameserver") == 0) {
            char *v = strtok_r(NULL, " \t\r\n", &save);
            if (v && r->nns < 3 && inet_pton(AF_INET, v, &r->ns[r->nns]) == 1) r->nns++;
        } else if (strcmp(key, "search") == 0 || strcmp(key, "domain") == 0) {
            r->nsearch = 0;
            char *v;
            while ((v = strtok_r(NULL, " \t\r\n", &save)) && r->nsearch < 6)
                snprintf(r->search[r->nsearch++], 256, "%s", v);
        } else if (strcmp(key, "options") == 0) {
            char *v;
            while ((v = strtok_r(NULL, " \t\r\n", &save)))
                if (strncmp(v, "ndots:", 6) == 0) r->ndots = atoi(v + 6);
        }
    }
    fclose(f);
}

/* Skip a (possibly compressed) name at msg[*off]; 0 on success. */
static int skip_name(const unsigned char *msg, int len, int *off) {
    int o = *off;
    while (o < len) {
        unsigned char c = msg[o];
        if (c == 0) { *off = o + 1; return 0; }
        if ((c & 0xc0) == 0xc0) { *off = o + 2; return o + 2 <= len ? 0 : -1; }
        o += c + 1;
    }
    return -1;
}

/* One query of NAME (type A) to NS: -1 error/timeout, 0 name does not exist or has no A, else count. */
static int query(struct in_addr ns, const char *name, struct in_addr *out, int max) {
    unsigned char q[512], a[1500];
    int ql = 12;
    unsigned short id = (unsigned short)(getpid() ^ (int)(now() * 1000));
    memset(q, 0, 12);
    q[0] = id >> 8; q[1] = id & 0xff; q[2] = 0x01; /* RD */ q[5] = 1; /* QDCOUNT */
    const char *p = name;
    while (*p) {
        const char *dot = strchr(p, '.');
        size_t l = dot ? (size_t)(dot - p) : strlen(p);
        if (l == 0 || l > 63 || ql + (int)l + 6 > (int)sizeof q) return -1;
        q[ql++] = (unsigned char)l;
        memcpy(q + ql, p, l);
        ql += (int)l;
        p += l;
        if (*p == '.') p++;
    }
    q[ql++] = 0;
    q[ql++] = 0; q[ql++] = 1; /* A */
    q[ql++] = 0; q[ql++] = 1; /* IN */
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(53), .sin_addr = ns};
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = socket(AF_INET, SOCK_DGRAM, 0);
        if (fd < 0) return -1;
        if (sendto(fd, q, ql, 0, (struct sockaddr *)&sa, sizeof sa) != ql) { close(fd); continue; }
        struct pollfd pfd = {.fd = fd, .events = POLLIN};
        if (poll(&pfd, 1, 2000) != 1) { close(fd); continue; }
        int n = (int)recv(fd, a, sizeof a, 0);
        close(fd);
        if (n < 12 || a[0] != q[0] || a[1] != q[1]) continue;
        int rcode = a[3] & 0x0f;
        if (rcode == 3) return 0;        /* NXDOMAIN */
        if (rcode != 0) return -1;       /* REFUSED, SERVFAIL ... */
        int qd = a[4] << 8 | a[5], an = a[6] << 8 | a[7], off = 12, count = 0;
        for (int i = 0; i < qd; i++) {
            if (skip_name(a, n, &off)) return -1;
            off += 4;
        }
        for (int i = 0; i < an && off < n; i++) {
            if (skip_name(a, n, &off) || off + 10 > n) return -1;
            int type = a[off] << 8 | a[off + 1], rdlen = a[off + 8] << 8 | a[off + 9];
            off += 10;
            if (off + rdlen > n) return -1;
            if (type == 1 && rdlen == 4 && count < max) memcpy(&out[count++], a + off, 4);
            off += rdlen;
        }
        return count;
    }
    return -1;
}

/* NAME's IPv4 addresses the way a libc resolver finds them: literal, else resolv.conf's search list. */
static int resolve(const char *name, struct in_addr *out, int max) {
    if (inet_pton(AF_INET, name, &out[0]) == 1) return 1;
    struct resolv r;
    read_resolv(&r);
    if (r.nns == 0) { fprintf(stderr, "probe: no nameserver in /etc/resolv.conf\n"); return -1; }
    char cands[8][512];
    int nc = 0, dots = 0;
    size_t len = strlen(name);
    for (const char *p = name; *p; p++) dots += *p == '.';
    if (len && name[len - 1] == '.') {
        snprintf(cands[nc], 512, "%.*s", (int)(len - 1), name);
        nc++;
    } else {
        if (dots >= r.ndots) snprintf(cands[nc++], 512, "%s", name);
        for (int i = 0; i < r.nsearch && nc < 7; i++) snprintf(cands[nc++], 512, "%s.%s", name, r.search[i]);
        if (dots < r.ndots) snprintf(cands[nc++], 512, "%s", name);
    }
    int failed = 0;
    for (int c = 0; c < nc; c++) {
        for (int s = 0; s < r.nns; s++) {
            int got = query(r.ns[s], cands[c], out, max);
            if (got > 0) return got;
            if (got == 0) break;         /* authoritative "no": next candidate, not next server */
            failed = 1;
        }
    }
    return failed ? -1 : 0;
}

/* ---- TCP ---------------------------------------------------------------------------------------------- */

/* 0 connected (fd in *out), 1 refused/unreachable, 2 timed out. */
static int connect_to(struct in_addr addr, int port, double timeout, int *out) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return 1;
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port), .sin_addr = addr};
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    if (rc < 0 && errno != EINPROGRESS) { close(fd); return 1; }
    if (rc < 0) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        int pr = poll(&pfd, 1, (int)(timeout * 1000));
        if (pr == 0) { close(fd); return 2; }
        int err = 0;
        socklen_t el = sizeof err;
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (pr < 0 || err) { close(fd); errno = err; return 1; }
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    *out = fd;
    return 0;
}

static int cmd_connect(const char *host, int port, double timeout) {
    struct in_addr addrs[MAX_ADDRS];
    int n = resolve(host, addrs, MAX_ADDRS);
    if (n <= 0) { printf("error: cannot resolve %s\n", host); return 1; }
    int fd, rc = connect_to(addrs[0], port, timeout, &fd);
    if (rc == 0) { printf("connected %s:%d\n", inet_ntoa(addrs[0]), port); close(fd); }
    else if (rc == 2) printf("timeout %s:%d after %.1fs\n", inet_ntoa(addrs[0]), port, timeout);
    else printf("error %s:%d: %s\n", inet_ntoa(addrs[0]), port, strerror(errno));
    return rc;
}

/* One GET; 0 on a 2xx (body printed), else 1 (reason on stderr). */
static int get_once(const char *host, int port, const char *path) {
    struct in_addr addrs[MAX_ADDRS];
    int n = resolve(host, addrs, MAX_ADDRS);
    if (n <= 0) { fprintf(stderr, "probe: cannot resolve %s\n", host); return 1; }
    int fd;
    if (connect_to(addrs[0], port, 3.0, &fd) != 0) {
        fprintf(stderr, "probe: cannot connect to %s:%d\n", inet_ntoa(addrs[0]), port);
        return 1;
    }
    struct timeval tv = {.tv_sec = 5};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char req[1024];
    int rl = snprintf(req, sizeof req, "GET %s HTTP/1.0\r\nHost: %s\r\nUser-Agent: probe\r\n\r\n", path, host);
    if (write(fd, req, rl) != rl) { close(fd); return 1; }
    static char buf[1 << 20];
    size_t got = 0;
    ssize_t r;
    while (got < sizeof buf - 1 && (r = read(fd, buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)r;
    close(fd);
    buf[got] = 0;
    int status = 0;
    if (sscanf(buf, "HTTP/%*d.%*d %d", &status) != 1) { fprintf(stderr, "probe: bad response\n"); return 1; }
    char *body = strstr(buf, "\r\n\r\n");
    if (status < 200 || status > 299) { fprintf(stderr, "probe: HTTP %d\n", status); return 1; }
    if (body) fputs(body + 4, stdout);
    fflush(stdout);
    return 0;
}

static int cmd_get(const char *url, double deadline_s) {
    char host[256], path[1024] = "/";
    int port = 80;
    if (strncmp(url, "http://", 7) != 0) { fprintf(stderr, "probe: only http:// URLs\n"); return 2; }
    const char *h = url + 7, *slash = strchr(h, '/');
    size_t hl = slash ? (size_t)(slash - h) : strlen(h);
    if (hl == 0 || hl >= sizeof host) return 2;
    memcpy(host, h, hl);
    host[hl] = 0;
    if (slash) snprintf(path, sizeof path, "%s", slash);
    char *colon = strchr(host, ':');
    if (colon) { *colon = 0; port = atoi(colon + 1); }
    double end = now() + deadline_s;
    for (;;) {
        if (get_once(host, port, path) == 0) return 0;
        if (now() >= end) return 1;
        usleep(500000);
    }
}

static volatile sig_atomic_t stop;
static void on_term(int s) { (void)s; stop = 1; }

static int cmd_serve(int port, const char *text) {
    signal(SIGPIPE, SIG_IGN);
    struct sigaction sa = {.sa_handler = on_term};
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa_in = {.sin_family = AF_INET, .sin_port = htons((unsigned short)port)};
    if (bind(fd, (struct sockaddr *)&sa_in, sizeof sa_in) || listen(fd, 64)) { perror("probe: bind"); return 1; }
    printf("serving on :%d\n", port);
    char resp[4096];
    int rl = snprintf(resp, sizeof resp,
                      "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s\n",
                      strlen(text) + 1, text);
    while (!stop) {
        int c = accept(fd, NULL, NULL);
        if (c < 0) continue;
        struct timeval tv = {.tv_sec = 5};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        char req[4096];
        size_t got = 0;
        ssize_t r;
        while (got < sizeof req - 1 && (r = read(c, req + got, sizeof req - 1 - got)) > 0) {
            got += (size_t)r;
            req[got] = 0;
            if (strstr(req, "\r\n\r\n")) break;
        }
        if (write(c, resp, rl) != rl) { /* the client went away */ }
        close(c);
    }
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "";
    if (strcmp(cmd, "echo") == 0) {
        for (int i = 2; i < argc; i++) printf("%s%s", i > 2 ? " " : "", argv[i]);
        printf("\n");
        return 0;
    }
    if (strcmp(cmd, "sleep") == 0 && argc == 3) { sleep((unsigned)atoi(argv[2])); return 0; }
    if (strcmp(cmd, "exit") == 0 && argc == 3) return atoi(argv[2]);
    if (strcmp(cmd, "serve") == 0 && argc == 4) return cmd_serve(atoi(argv[2]), argv[3]);
    if (strcmp(cmd, "get") == 0 && (argc == 3 || argc == 4)) return cmd_get(argv[2], argc == 4 ? atof(argv[3]) : 20);
    if (strcmp(cmd, "connect") == 0 && (argc == 4 || argc == 5))
        return cmd_connect(argv[2], atoi(argv[3]), argc == 5 ? atof(argv[4]) : 3);
    if (strcmp(cmd, "resolve") == 0 && (argc == 3 || argc == 4)) {
        struct in_addr addrs[MAX_ADDRS];
        double end = now() + (argc == 4 ? atof(argv[3]) : 0);
        int n;
        while ((n = resolve(argv[2], addrs, MAX_ADDRS)) <= 0 && now() < end) usleep(500000);
        for (int i = 0; i < n; i++) printf("%s\n", inet_ntoa(addrs[i]));
        return n > 0 ? 0 : 1;
    }
    fprintf(stderr, "usage: probe echo|sleep|exit|serve|get|resolve|connect ... (see probe.c)\n");
    return 2;
}
