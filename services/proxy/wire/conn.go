package main

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"net"
	"strconv"
	"sync/atomic"
	"time"
)

// clientConn is one adopted client connection and what the Python proxy decided about it.
type clientConn struct {
	w           *wire
	id          uint64
	c           *net.TCPConn
	client      string
	sandbox     string
	port        int
	upstream    string
	upstreamKey string
	routing     [3][]byte // first e2b-sandbox-id, e2b-sandbox-port, host (nil: absent)
	present     [3]bool
	token       []byte // SHA-256 of the access token
	apiKeys     bool
	daemon      bool
	gen         uint64
	buf         []byte
	stopping    atomic.Bool
}

func newClientConn(w *wire, m *message, c *net.TCPConn, gen uint64) *clientConn {
	cc := &clientConn{
		w: w, id: m.ID, c: c, client: m.Client, sandbox: m.Sandbox, port: m.Port,
		upstream: m.Upstream, apiKeys: m.APIKeys, daemon: m.Daemon, gen: gen,
	}
	cc.upstreamKey = net.JoinHostPort(m.Upstream, strconv.Itoa(m.Port))
	for i, r := range m.Routing {
		if r != nil {
			cc.routing[i], cc.present[i] = *r, true
		}
	}
	cc.token, _ = hex.DecodeString(m.Token)
	return cc
}

// wake interrupts a connection waiting for its next request (shutdown).
func (cc *clientConn) wake() {
	cc.stopping.Store(true)
	cc.c.SetReadDeadline(time.Now())
}

var errHandBack = errors.New("hand back")

var routingNames = [3][]byte{[]byte("e2b-sandbox-id"), []byte("e2b-sandbox-port"), []byte("host")}

func (cc *clientConn) serve() {
	defer cc.w.done(cc)
	cfg := cc.w.cfg
	keepAlive := time.Duration(cfg.KeepAlive * float64(time.Second))
	for {
		if len(cc.buf) == 0 {
			cc.c.SetReadDeadline(time.Now().Add(keepAlive))
			if !cc.fill() {
				cc.close()
				return
			}
		}
		end := headEnd(cc.buf, cfg.MaxHead)
		if end < 0 || !cc.w.current(cc.sandbox, cc.gen) {
			cc.handBack() // a head in pieces or too large; or the sandbox changed
			return
		}
		req, keep, err := cc.request(end)
		if err != nil {
			cc.handBack()
			return
		}
		if !cc.exchange(req, keep) {
			return
		}
		if !keep {
			cc.close()
			return
		}
	}
}

// fill reads once into buf; false on EOF, error or timeout (the connection is done).
func (cc *clientConn) fill() bool {
	if cap(cc.buf)-len(cc.buf) < 4*1024 {
		grown := make([]byte, len(cc.buf), 2*cap(cc.buf)+8*1024)
		copy(grown, cc.buf)
		cc.buf = grown
	}
	n, err := cc.c.Read(cc.buf[len(cc.buf):cap(cc.buf)])
	cc.buf = cc.buf[:len(cc.buf)+n]
	if cc.stopping.Load() {
		return false
	}
	return n > 0 || err == nil
}

// outgoing is a request ready for the sandbox.
type outgoing struct {
	raw      []byte // the rebuilt request, body included
	size     int    // bytes of buf it answers
	activity bool
}

// request checks and rebuilds the request at the front of buf (its head is buf[:end]).
// errHandBack: the Python proxy must see it.
func (cc *clientConn) request(end int) (*outgoing, bool, error) {
	cfg := cc.w.cfg
	h, err := parseRequest(cc.buf[:end], cfg.MaxHeaders)
	if err != nil {
		return nil, false, errHandBack
	}
	if m := string(h.method); m == "HEAD" || m == "CONNECT" {
		return nil, false, errHandBack
	}
	var first [3][]byte
	var seen [3]bool
	var token []byte
	tokenSeen := false
	length := int64(0)
	lengthSeen := false
	keep := true
	for _, f := range h.headers {
		switch string(f.lower) {
		case "e2b-sandbox-id", "e2b-sandbox-port", "host":
			for i := range routingNames {
				if bytes.Equal(f.lower, routingNames[i]) && !seen[i] {
					first[i], seen[i] = f.value, true
				}
			}
		case "x-access-token":
			if !tokenSeen {
				token, tokenSeen = f.value, true
			}
		case "x-api-key":
			if cc.apiKeys {
				return nil, false, errHandBack
			}
		case "content-length":
			n, ok := contentLength(f.value)
			if !ok || lengthSeen {
				return nil, false, errHandBack
			}
			length, lengthSeen = n, true
		case "transfer-encoding", "expect", "upgrade":
			return nil, false, errHandBack
		case "connection":
			if hasToken(f.value, "close") {
				keep = false
			}
		}
	}
	// The same sandbox port, named the same way, with the sandbox's own token.
	for i := range first {
		if seen[i] != cc.present[i] || !bytes.Equal(first[i], cc.routing[i]) {
			return nil, false, errHandBack
		}
	}
	digest := sha256.Sum256(token)
	if !tokenSeen || len(cc.token) != len(digest) || subtle.ConstantTimeCompare(digest[:], cc.token) != 1 {
		return nil, false, errHandBack
	}
	if length > cfg.MaxBody {
		return nil, false, errHandBack
	}
	size := end + int(length)
	if len(cc.buf) < size && !cc.awaitBody(size) {
		return nil, false, errHandBack
	}
	path := h.target
	if q := bytes.IndexByte(path, '?'); q >= 0 {
		path = path[:q]
	}
	out := &outgoing{size: size, activity: !(cc.daemon && string(path) == "/health")}
	out.raw = cc.rebuild(h, cc.buf[end:size])
	return out, keep, nil
}

// awaitBody reads the rest of a body that follows its head, for a short while: a body that
// is slower goes back to the Python proxy with its timeouts.
func (cc *clientConn) awaitBody(size int) bool {
	grace := time.Duration(cc.w.cfg.BodyGrace * float64(time.Second))
	cc.c.SetReadDeadline(time.Now().Add(grace))
	for len(cc.buf) < size {
		if cap(cc.buf)-len(cc.buf) < size-len(cc.buf) {
			grown := make([]byte, len(cc.buf), size+64*1024)
			copy(grown, cc.buf)
			cc.buf = grown
		}
		n, err := cc.c.Read(cc.buf[len(cc.buf):cap(cc.buf)])
		cc.buf = cc.buf[:len(cc.buf)+n]
		if err != nil {
			return false
		}
	}
	return true
}

// rebuild writes the request for the sandbox from the parsed head (never the client's raw
// bytes): hop-by-hop and torpor's own headers dropped, the forwarded-* headers added.
func (cc *clientConn) rebuild(h *head, body []byte) []byte {
	nf := cc.w.notForwarded
	out := make([]byte, 0, 512+len(body))
	out = append(out, h.method...)
	out = append(out, ' ')
	out = append(out, h.target...)
	out = append(out, " HTTP/1.1\r\nhost: "...)
	out = append(out, cc.upstreamKey...)
	out = append(out, "\r\n"...)
	var forwardedHost []byte
	hostSeen := false
	for _, f := range h.headers {
		if nf[string(f.lower)] {
			if !hostSeen && string(f.lower) == "host" {
				forwardedHost, hostSeen = f.value, true
			}
			continue
		}
		if bytes.HasPrefix(f.lower, []byte("sec-websocket-")) {
			continue
		}
		out = append(out, f.lower...)
		out = append(out, ": "...)
		out = append(out, f.value...)
		out = append(out, "\r\n"...)
	}
	if hostSeen {
		out = append(out, "x-forwarded-host: "...)
		out = append(out, forwardedHost...)
		out = append(out, "\r\n"...)
	}
	out = append(out, "x-forwarded-for: "...)
	out = append(out, cc.client...)
	out = append(out, "\r\nx-forwarded-proto: http\r\n\r\n"...)
	return append(out, body...)
}

// handBack returns the connection, with its unanswered bytes, to the Python proxy.
func (cc *clientConn) handBack() {
	data := append([]byte(nil), cc.buf...)
	cc.w.giveBack(cc.id, cc.c, data)
}

func (cc *clientConn) close() {
	cc.c.Close()
	cc.w.send(&message{Op: "closed", ID: cc.id}, nil)
}

// consumed drops an answered request from the front of buf.
func (cc *clientConn) consumed(n int) {
	rest := len(cc.buf) - n
	copy(cc.buf, cc.buf[n:])
	cc.buf = cc.buf[:rest]
}
