#!/usr/bin/env python3
"""keepalive_burst.py PORT PATH CONNS ROUNDS: bursts of POSTs on kept-alive connections.

Opens CONNS connections to 127.0.0.1:PORT; each round sends one POST to PATH
(a unique X-Id and X-Message-Id, a ~200-byte JSON body) on every connection
at once, then reads every answer, waiting at most 3 s for each.  A request
left without an answer is counted and its connection reopened.  Prints
"sent N answered {status: count} unanswered U".

The reproducer of the test sink's stall (README): against
QB_SINK_EPOLL=1 test/sink/qb_sink --threads 1, 128 or 256 connections lose
whole bursts; with the sink's poll threads, none.
"""
import selectors, socket, sys, time, uuid

port, path, conns, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])


def connect():
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


socks = [connect() for _ in range(conns)]
answered, unanswered, sent = {}, 0, 0
for r in range(rounds):
    sel, buf = selectors.DefaultSelector(), {}
    for s in socks:
        k = str(uuid.uuid4())
        body = ('{"n": %d, "pad": "%s"}' % (sent, "x" * 150)).encode()
        s.sendall(("POST %s HTTP/1.1\r\nHost: qb\r\nContent-Type: application/json\r\nX-Id: %s\r\n"
                   "X-Message-Id: %s\r\nContent-Length: %d\r\n\r\n" % (path, k, k, len(body))).encode() + body)
        sent += 1
        buf[s] = b""
        sel.register(s, selectors.EVENT_READ)
    left, deadline = set(socks), time.time() + 3
    while left and time.time() < deadline:
        for key, _ in sel.select(max(0, deadline - time.time())):
            s = key.fileobj
            d = s.recv(65536)
            if d:
                buf[s] += d
            h = buf[s].find(b"\r\n\r\n")
            if d and h < 0:
                continue
            if d:
                cl = [int(l.split(b":")[1]) for l in buf[s][:h].split(b"\r\n") if l.lower().startswith(b"content-length:")]
                if len(buf[s]) < h + 4 + (cl[0] if cl else 0):
                    continue
                st = buf[s].split(b" ")[1].decode()
                answered[st] = answered.get(st, 0) + 1
            left.discard(s)
            sel.unregister(s)
    for s in left:
        unanswered += 1
        socks[socks.index(s)] = connect()
        s.close()
    sel.close()
print("sent %d answered %s unanswered %d" % (sent, answered, unanswered))
