#!/usr/bin/env python3
"""Regenerate the seed corpora of test/fuzz/corpus/<harness>/ from the unit
tests' cases (test/unit/*.c: the C string literals they pass to the functions
each harness fuzzes, valid and invalid), the YAML examples of docs/ and
README.md, and a few hand-written inputs per harness.  Files are named
seed-<harness-specific>-<sha1 prefix>; crash-* reproducers are left alone.

    python3 test/fuzz/seeds.py        (from the repository root)
"""
import glob
import hashlib
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CORPUS = os.path.join(ROOT, "test", "fuzz", "corpus")
MAX_SEED = 4096

ESC = {"n": b"\n", "t": b"\t", "r": b"\r", "\\": b"\\", '"': b'"', "'": b"'",
       "0": b"\0", "a": b"\a", "b": b"\b", "f": b"\f", "v": b"\v", "?": b"?"}


def c_literal(src, i):
    """The bytes of the C string literal at src[i] == '"', and the index after it."""
    out = bytearray()
    i += 1
    while src[i] != '"':
        c = src[i]
        if c == "\\":
            n = src[i + 1]
            if n == "x":
                j = i + 2
                while j < len(src) and src[j] in "0123456789abcdefABCDEF":
                    j += 1
                out.append(int(src[i + 2:j], 16) & 0xFF)
                i = j
                continue
            if n in "01234567":
                j = i + 1
                while j < i + 4 and src[j] in "01234567":
                    j += 1
                out.append(int(src[i + 1:j], 8) & 0xFF)
                i = j
                continue
            out += ESC.get(n, n.encode())
            i += 2
            continue
        out += c.encode("utf-8")
        i += 1
    return bytes(out), i + 1


def literal_run(src, i, macros):
    """Adjacent literals (and macros that are literals) from i; (bytes or None, end)."""
    out = b""
    seen = False
    while True:
        m = re.compile(r"(\s|/\*.*?\*/|//[^\n]*)*", re.S).match(src, i)
        i = m.end()
        if i < len(src) and src[i] == '"':
            b, i = c_literal(src, i)
            out += b
            seen = True
            continue
        m = re.compile(r"[A-Z_][A-Z0-9_]*").match(src, i)
        if m and m.group(0) in macros:
            out += macros[m.group(0)]
            i = m.end()
            seen = True
            continue
        return (out if seen else None), i


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8", errors="surrogateescape") as f:
        return f.read()


def config_tests():
    """The configuration family's unit tests as one text: test_config.h (its
    macros first) and test_config.c, test_config_<part>.c (not the arena's)."""
    names = ["test/unit/test_config.h"] + sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "test", "unit", "test_config*.c"))
        if not p.endswith("test_config_arena.c"))
    return "\n".join(read(n) for n in names)


def macros_of(src):
    macros = {}
    for m in re.finditer(r"^#define ([A-Z_][A-Z0-9_]*)[ \t]+(?=\")", src, re.M):
        b, _ = literal_run(src, m.end(), macros)
        if b is not None:
            macros[m.group(1)] = b
    return macros


def call_args(src, func, macros):
    """The first argument of each call func(...) that is a string literal."""
    for m in re.finditer(r"\b%s\s*\(" % re.escape(func), src):
        b, _ = literal_run(src, m.end(), macros)
        if b is not None:
            yield b


def all_literals(src, macros):
    i = 0
    while True:
        j = src.find('"', i)
        if j < 0:
            return
        # skip character constants like '"'
        if j > 0 and src[j - 1] == "'" and src[j + 1:j + 2] == "'":
            i = j + 2
            continue
        b, i = literal_run(src, j, macros)
        if b is not None:
            yield b


def write(harness, items, tag="seed"):
    d = os.path.join(CORPUS, harness)
    os.makedirs(d, exist_ok=True)
    for old in glob.glob(os.path.join(d, "seed-*")):
        os.remove(old)
    seen = set()
    for b in items:
        if b is None or len(b) > MAX_SEED or b in seen:
            continue
        seen.add(b)
        name = "%s-%s" % (tag, hashlib.sha1(b).hexdigest()[:12])
        with open(os.path.join(d, name), "wb") as f:
            f.write(b)
    print("%-22s %d seeds" % (harness, len(seen)))


def docs_yaml():
    for path in sorted(glob.glob(os.path.join(ROOT, "docs", "*.md"))) + [os.path.join(ROOT, "README.md")]:
        text = open(path, encoding="utf-8").read()
        for m in re.finditer(r"```ya?ml[^\n]*\n(.*?)```", text, re.S):
            yield m.group(1).encode()


# ---- the harnesses ------------------------------------------------------

def config():
    src = config_tests()
    mac = macros_of(src)
    docs = []
    for f in ("accept", "refuse", "refused_message"):
        docs += list(call_args(src, f, mac))
    m = re.search(r"full_doc\[\] =\s*", src)
    full = literal_run(src, m.end(), mac)[0]
    docs.append(full)
    docs += list(docs_yaml())
    return docs, full


def config_env(full):
    src = config_tests()
    mac = macros_of(src)
    out = []
    for m in re.finditer(r'setenv\("QUEUEBOX_([A-Za-z0-9_]*)",\s*', src):
        v, _ = literal_run(src, m.end(), mac)
        if v is not None:
            out.append(b"\x01" + m.group(1).encode() + b"=" + v + b"\n" + full)
    out.append(b"\x02OUTBOX_BATCHSIZE=5\nROUTES_0_DESTINATION=log\n" + full)
    out.append(b"\x03DESTINATIONS_PAYMENTS_HEADERS_X_API_KEY=k\nHTTP_LISTEN=:8080\nADMIN_TOKEN=0123456789abcdef0\n" + full)
    out.append(b"\x01OUTBOX_BACKOFF_INITIALMS=7\n")
    # ${file:PATH}: the one allowed file, one outside, one named through ${NAME}
    hdr = b"destinations:\n  p: {type: http, baseUrl: \"http://h\", headers: {X-K: \"%s\"}}\n"
    for ref in (b"${file:/tmp/qbf-secrets/token}", b"Bearer ${file:${QBF_FILE_DIR}/token}",
                b"${file:/etc/passwd}", b"${file:/tmp/qbf-secrets/../x}", b"$${file:/x}"):
        out.append(b"\x00" + hdr % ref)
    return out


def jsonpath():
    src = read("test/unit/test_extract.c")
    mac = macros_of(src)
    m = re.search(r"\*DOC =\s*", src)
    doc = literal_run(src, m.end(), mac)[0]
    paths = []
    for m in re.finditer(r"expect_text\(doc,\s*", src):
        paths.append(literal_run(src, m.end(), mac)[0])
    paths += list(call_args(src, "qb_jsonpath_check", mac))
    out = [p + b"\n" + doc for p in paths if p is not None]
    out += [b"$[0]\n[1,2]", b"$['a\\\\b']\n{\"a\\\\b\": 1}", b"$.a\n{\"a\": \"\"}", b"$\n\"s\""]
    return out


def route():
    src = read("test/unit/test_route.c")
    mac = macros_of(src)
    out = []
    for m in re.finditer(r'\{\s*(?=")', src):
        a, i = literal_run(src, m.end(), mac)
        r = re.compile(r"\s*,\s*").match(src, i)
        if a is None or not r:
            continue
        b, _ = literal_run(src, r.end(), mac)
        if b is not None:
            out.append(a + b"\n" + b)
    for lit in all_literals(src, mac):
        if b"\n" not in lit and len(lit) < 200:
            out.append(lit + b"\norders.eu.created")
    return out


def template():
    src = read("test/unit/test_extract.c")
    mac = macros_of(src)
    out = []
    for t in list(call_args(src, "qb_template_check", mac)) + list(call_args(src, "qb_template_render", mac)):
        out.append(b"\x00" + t + b"\nstripe\ninvoice.paid")
        out.append(b"\x01" + t + b"\norders.created\nk-1")
    out += [b"\x01{{ topic }}.{{key}}\norders\nk", b"\x06{{topic}}{{key}}\n\n", b"\x00{{ source \n\n",
            b"\x00{{{{ source }}}}\ns\ne"]
    return out


def auth():
    body = b'{"id":"evt_1","type":"invoice.paid"}'
    now = b"1764460800"
    return [
        b"\x00X-Signature: sha256=@SIG@\n\n" + body,
        b"\x00X-Signature: sha256=00ff\n\n" + body,
        b"\x00X-Signature: @SIG@\n\n" + body,
        b"\x01X-Acme-Sig: @SIG@\n\n" + body,
        b"\x01X-Acme-Sig: AAAA\n\n" + body,
        b"\x02X-Hub-Signature-256: sha256=@SIG@\n\n" + body,
        b"\x02x-hub-signature-256: SHA256=@SIG@\n\n",
        b"\x03Stripe-Signature: t=" + now + b",v1=@SIG@,v0=deadbeef\n\n" + body,
        b"\x03Stripe-Signature: t=" + now + b",v1=" + b"0" * 64 + b",v1=@SIG@\n\n" + body,
        b"\x03Stripe-Signature: v1=@SIG@\n\n" + body,
        b"\x0bStripe-Signature: t=1764460000,v1=@SIG@\n\n" + body,
        b"\x04webhook-id: msg_2Lh9\nwebhook-timestamp: " + now + b"\nwebhook-signature: v1,AAAA v1,@SIG@\n\n" + body,
        b"\x04webhook-id: msg_2Lh9\nwebhook-timestamp: " + now + b"\nwebhook-signature: v2,x v1,@SIG@ v1a,b\n\n" + body,
        b"\x04webhook-id: m\nwebhook-timestamp: -9223372036854775808\nwebhook-signature: v1,@SIG@\n\n" + body,
        b"\x05Authorization: Bearer @TOK@\n\n",
        b"\x05Authorization: bearer @TOK@\n\n",
        b"\x05Authorization: Basic dG9rLTEyMw==\n\n",
        b"\x06X-Signature: @SIG@\n\n" + body,
        b"\x07\n\n" + body,
    ]


def ingress():
    out = []
    body = b'{"id":"evt_1","type":"invoice.paid","data":{"object":{"customer":"cus_9"},"id":"d1"},"key":"k1","items":[{"id":7}]}'
    heads = [
        b"X-Tenant: acme\nX-Correlation-Id: c-1\n",
        b"X-Request-Id: r-1\nX-Signature: sha256=@SIG@\nX-Tenant: acme\nX-Tenant: beta\n",
        b"X-GitHub-Delivery: d-9\nX-GitHub-Event: push\nX-Hub-Signature-256: sha256=@SIG@\n",
        b"Stripe-Signature: t=1764460800,v1=@SIG@\nUser-Agent: Stripe/1.0\n",
        b"webhook-id: msg_1\nwebhook-timestamp: 1764460800\nwebhook-signature: v1,@SIG@\n",
        b"Authorization: Bearer @TOK@\nX-Event-Type: order.paid\nCookie: a=b\n",
        b"X-Acme-Sig: @SIG@\nHost: example\nContent-Length: 99\n",
    ]
    for i, h in enumerate(heads):
        out.append(bytes([i]) + h + b"\n" + body)
        out.append(bytes([i]) + h + b"Bad Header: v\n\n" + body)
        out.append(bytes([i]) + h + b"X-Ctl: a\x01b\n\n" + body)
        out.append(bytes([i]) + h + b"\n" + b'{"id": 5, "type": "drop"}')
        out.append(bytes([i]) + h + b"\n" + b'[1,2')
    return out


def publish():
    out = [b"30\n{}", b"Wed, 21 Oct 2015 07:28:00 GMT\n{\"X-A\": \"1\"}"]
    for src in ("test/unit/test_http.c", "test/unit/test_amqp.c"):
        text = read(src)
        mac = macros_of(text)
        for lit in all_literals(text, mac):
            if lit.startswith(b"{") and b":" in lit:
                out.append(b"\n" + lit)
    out += [b"120\n{\"X-Correlation-Id\": \"c-1\", \"X-Num\": 7, \"X-Null\": null, \"X-Obj\": {\"a\": [1]}}",
            b"\n{\"Nats-Msg-Id\": \"forged\", \"message-id\": \"forged\", \"X-Message-Id\": \"f\"}",
            b"\n{\"\": \"empty\", \"Bad Name\": \"v\", \"X-Evil\": \"a\\r\\nInjected: 1\"}",
            b"\n{\"webhook-signature\": \"x\", \"X-Signature\": \"y\", \"Content-Type\": \"text/plain\"}"]
    return out


def broker_headers():
    return [b"\x00X-Correlation-Id\nc-1\x03X-Num\n\x07\x00\x00\x00",
            b"\x01message-id\nm-1\x00message-id\nm-2\x02X-Bool\n\x01",
            b"\x0bX-F32\n\x00\x00\x80\x3f\x0cX-F64\n\x00\x00\x00\x00\x00\x00\xf0\x3f",
            b"\x0eX-Void\n\x0fX-Dec\n\x10X-Table\n\x11X-Array\n",
            b"\x00caf\xc3\xa9\nvalue \xe2\x82\xac\x80X-NoHeaders\nv"]


def url():
    out = []
    for text in (config_tests(), read("test/unit/test_amqp.c"), read("test/unit/test_odbc.c"),
                 read("test/unit/test_url.c")):
        mac = macros_of(text)
        for lit in all_literals(text, mac):
            if (b"://" in lit or b"${" in lit or b"$$" in lit) and b"\n" not in lit and len(lit) < 400:
                out.append(lit)
    out += [b"sqlserver://queuebox:S3CR3T;x@db.internal:1433/app?encrypt=request&odbcDriver=%7BFreeTDS%7D",
            b"sqlserver://u:p%7D%3B@h/db?odbcDriver=/usr/lib/libtdsodbc.so",
            b"nats://u:S3CR3T@h:4222,tls://h2:4443", b"127.0.0.1:9092,PLAINTEXT://k:9093",
            b"amqp://u:S3CR3T@h:5672/%2f?heartbeat=10", b"${QBF_SECRET}", b"$${QBF_SECRET}",
            # the reader: hosts that client libraries once read otherwise (cnats: the last '@')
            b"nats://h1/x@evil:4222", b"nats://u:p%40w@[::1]:4222", b"http://127.0.0.1:80@hooks.example/",
            b"https://0x7f.1:8443/p", b"sqlserver://u:p@2130706433/db"]
    return out


def egress():
    """A list, then URLs: the unit test's lists against its hosts and URLs."""
    text = read("test/unit/test_egress.c")
    mac = macros_of(text)
    lits = [l for l in all_literals(text, mac) if b"\n" not in l and len(l) < 200]
    lists = [l for l in lits if b"://" not in l and b" is " not in l][:40]
    urls = [l for l in lits if b"://" in l or b":" in l]
    out = []
    for i, lst in enumerate(lists):
        for u in urls[i % 7::7]:
            out.append(lst + b"\n" + u)
    out += [b"hooks.partner.example\nhttp://127.0.0.1:57998",
            b"hooks.partner.example\nhttp://[::ffff:127.0.0.1]/,http://2130706433/",
            b"10.0.0.0/8, *.example.net\n10.1.2.3:9092,a.example.net:9092",
            b"\nhttp://0xa9.0xfe.0xa9.0xfe/latest",
            b"::ffff:10.0.0.0/104\namqp://u:p@[::ffff:10.0.0.1]:5672/vh"]
    return out


def main():
    docs, full = config()
    write("fuzz_config", docs)
    write("fuzz_config_env", config_env(full))
    write("fuzz_jsonpath", jsonpath())
    write("fuzz_route", route())
    write("fuzz_template", template())
    write("fuzz_auth", auth())
    write("fuzz_ingress", ingress())
    write("fuzz_publish", publish())
    write("fuzz_broker_headers", broker_headers())
    write("fuzz_url", url())
    write("fuzz_egress", egress())


if __name__ == "__main__":
    main()
