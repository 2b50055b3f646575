package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httputil"
	"strconv"
	"sync"
	"time"
)

// upConn is a keep-alive connection to a sandbox port.
type upConn struct {
	c      net.Conn
	r      *bufio.Reader
	key    string
	idleAt time.Time
	reused bool
}

// pool keeps idle upstream connections and bounds concurrent exchanges per sandbox port.
type pool struct {
	mu     sync.Mutex
	idle   map[string][]*upConn
	busy   map[string]int
	limit  int
	expiry time.Duration
}

func newPool(limit int, expiry time.Duration) *pool {
	return &pool{idle: map[string][]*upConn{}, busy: map[string]int{}, limit: limit, expiry: expiry}
}

// take reserves an exchange slot; false when the sandbox port has its limit of exchanges
// under way (the Python proxy queues them).
func (p *pool) take(key string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.busy[key] >= p.limit {
		return false
	}
	p.busy[key]++
	return true
}

func (p *pool) give(key string) {
	p.mu.Lock()
	if p.busy[key]--; p.busy[key] <= 0 {
		delete(p.busy, key)
	}
	p.mu.Unlock()
}

func (p *pool) idleConn(key string) *upConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	list := p.idle[key]
	for len(list) > 0 {
		u := list[len(list)-1]
		list = list[:len(list)-1]
		if time.Since(u.idleAt) < p.expiry {
			p.idle[key] = list
			u.reused = true
			return u
		}
		u.c.Close()
	}
	delete(p.idle, key)
	return nil
}

func (p *pool) release(u *upConn) {
	u.idleAt = time.Now()
	p.mu.Lock()
	p.idle[u.key] = append(p.idle[u.key], u)
	p.mu.Unlock()
}

func (p *pool) drop(key string) {
	p.mu.Lock()
	list := p.idle[key]
	delete(p.idle, key)
	p.mu.Unlock()
	for _, u := range list {
		u.c.Close()
	}
}

func dial(key string) (*upConn, error) {
	c, err := net.DialTimeout("tcp", key, 5*time.Second)
	if err != nil {
		return nil, err
	}
	if t, ok := c.(*net.TCPConn); ok {
		t.SetNoDelay(true)
	}
	return &upConn{c: c, r: bufio.NewReaderSize(c, 64*1024), key: key}, nil
}

var errNothing = errors.New("the connection to the sandbox is closed")

// exchange relays one request and its answer. False: the connection is no longer ours
// (handed back or closed).
func (cc *clientConn) exchange(req *outgoing, keep bool) bool {
	p := cc.w.pool
	key := cc.upstreamKey
	if !p.take(key) {
		cc.handBack()
		return false
	}
	defer p.give(key)
	started := time.Now()
	u := p.idleConn(key)
	if u == nil {
		var err error
		if u, err = dial(key); err != nil {
			cc.handBack() // refused: the Python proxy retries through the boot grace
			return false
		}
	}
	h, got, err := cc.send(u, req)
	if err != nil && u.reused && !got {
		// A kept-alive connection the sandbox closed meanwhile saw nothing: once more.
		u.c.Close()
		if u, err = dial(key); err != nil {
			cc.handBack()
			return false
		}
		h, _, err = cc.send(u, req)
	}
	if err != nil {
		u.c.Close()
		cc.w.countRefusal()
		cc.refuse(fmt.Sprintf("The sandbox %s: %v", cc.sandbox, err))
		return false
	}
	cc.consumed(req.size)
	ok := cc.answer(u, h, keep, started)
	cc.w.exchanged(cc.sandbox, req.activity, time.Since(started))
	return ok
}

// send writes the request and reads the answer's final head. got: the sandbox sent bytes.
func (cc *clientConn) send(u *upConn, req *outgoing) (*head, bool, error) {
	if _, err := u.c.Write(req.raw); err != nil {
		return nil, false, errNothing
	}
	cfg := cc.w.cfg
	for interim := 0; interim < 8; interim++ {
		raw, got, err := readHead(u.r, cfg.MaxRespHead)
		if err != nil {
			return nil, got, err
		}
		h, err := parseResponse(raw, cfg.MaxRespHeaders)
		if err != nil {
			return nil, true, errors.New("a malformed response head")
		}
		if h.status >= 200 {
			return h, true, nil
		}
		if h.status == 101 {
			return nil, true, errors.New("an upgrade nobody asked for")
		}
	}
	return nil, true, errors.New("too many interim responses")
}

// readHead reads a response head (through the blank line) from r.
func readHead(r *bufio.Reader, limit int) ([]byte, bool, error) {
	var out []byte
	for {
		line, err := r.ReadSlice('\n')
		if len(out)+len(line) > limit {
			return nil, true, errors.New("a response head over the limit")
		}
		out = append(out, line...)
		if err != nil {
			if len(out) == 0 && (err == io.EOF || isReset(err)) {
				return nil, false, errNothing
			}
			if err == bufio.ErrBufferFull {
				continue
			}
			return nil, len(out) > 0, errNothing
		}
		if len(line) == 2 && line[0] == '\r' || len(line) == 1 {
			return out, true, nil
		}
	}
}

func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op)
}

// answer writes the sandbox's answer to the client. False: the connection was closed.
func (cc *clientConn) answer(u *upConn, h *head, keep bool, started time.Time) bool {
	w := cc.w
	var length int64 = -1
	chunkedIn := false
	upstreamKeep := h.minor == 1
	for _, f := range h.headers {
		switch string(f.lower) {
		case "content-length":
			n, ok := contentLength(f.value)
			if !ok || length >= 0 && n != length {
				return cc.broken(u, "a malformed Content-Length")
			}
			length = n
		case "transfer-encoding":
			if chunkedIn || !bodyIsChunked(f.value) {
				return cc.broken(u, "a Transfer-Encoding other than chunked")
			}
			chunkedIn = true
		case "connection":
			if hasToken(f.value, "close") {
				upstreamKeep = false
			}
		}
	}
	if chunkedIn && length >= 0 {
		return cc.broken(u, "both Content-Length and Transfer-Encoding")
	}
	noBody := h.status == 204 || h.status == 304
	chunkedOut := !noBody && length < 0
	line := w.statusLines[h.status]
	if line == nil {
		line = []byte("HTTP/1.1 " + strconv.Itoa(h.status) + " \r\n")
	}
	out := make([]byte, 0, 1024)
	out = append(out, line...)
	if w.cfg.Date {
		out = append(out, "date: "...)
		out = append(out, httpDate()...)
		out = append(out, "\r\n"...)
	}
	out = append(out, w.defaultHead...)
	for _, f := range h.headers {
		if w.hopByHop[string(f.lower)] {
			continue
		}
		out = append(out, f.name...)
		out = append(out, ": "...)
		out = append(out, f.value...)
		out = append(out, "\r\n"...)
	}
	if chunkedOut {
		out = append(out, "transfer-encoding: chunked\r\n"...)
	}
	if !keep {
		out = append(out, "connection: close\r\n"...)
	}
	out = append(out, "\r\n"...)
	switch {
	case noBody:
		return cc.finish(u, out, upstreamKeep)
	case length >= 0 && int(length) <= u.r.Buffered():
		body, _ := u.r.Peek(int(length))
		out = append(out, body...)
		u.r.Discard(int(length))
		return cc.finish(u, out, upstreamKeep) // the common case: one write
	default:
		var body io.Reader = u.r
		switch {
		case length >= 0:
			body = io.LimitReader(u.r, length)
		case chunkedIn:
			body = httputil.NewChunkedReader(u.r)
		default:
			upstreamKeep = false // delimited by the close
		}
		if !cc.stream(out, body, length, chunkedOut, u) {
			return false
		}
		if chunkedIn && !skipTrailer(u.r) {
			return cc.cut(u)
		}
		if upstreamKeep {
			cc.w.pool.release(u)
		} else {
			u.c.Close()
		}
		return true
	}
}

// stream forwards a body still arriving (re-chunked when chunkedOut), writing what has
// arrived whenever the sandbox has nothing more buffered, so a small answer is one write.
func (cc *clientConn) stream(out []byte, body io.Reader, length int64, chunkedOut bool, u *upConn) bool {
	buf := make([]byte, 32*1024)
	var sent int64
	for {
		if len(out) > 0 && (u.r.Buffered() == 0 || len(out) > 256*1024) {
			if _, err := cc.c.Write(out); err != nil {
				u.c.Close()
				cc.c.Close()
				cc.gone()
				return false
			}
			out = out[:0]
		}
		n, err := body.Read(buf)
		if n > 0 {
			sent += int64(n)
			if chunkedOut {
				out = strconv.AppendInt(out, int64(n), 16)
				out = append(out, "\r\n"...)
				out = append(out, buf[:n]...)
				out = append(out, "\r\n"...)
			} else {
				out = append(out, buf[:n]...)
			}
		}
		if err == io.EOF && (length < 0 || sent == length) {
			break
		}
		if err != nil {
			if len(out) > 0 {
				cc.c.Write(out) // what came, then the cut
			}
			return cc.cut(u)
		}
	}
	if chunkedOut {
		out = append(out, "0\r\n\r\n"...)
	}
	if len(out) > 0 {
		if _, err := cc.c.Write(out); err != nil {
			u.c.Close()
			cc.c.Close()
			cc.gone()
			return false
		}
	}
	return true
}

// skipTrailer reads the trailer section after the last chunk (dropped, as the relay drops it)
// through its blank line, so a kept-alive connection starts clean at the next answer.
func skipTrailer(r *bufio.Reader) bool {
	for size := 0; size < 64*1024; {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return false
		}
		size += len(line)
		if len(line) == 2 && line[0] == '\r' {
			return true
		}
	}
	return false
}

func bodyIsChunked(v []byte) bool {
	return string(v) == "chunked" || len(v) == 7 && hasToken(v, "chunked")
}

// finish writes a whole answer in one write.
func (cc *clientConn) finish(u *upConn, out []byte, upstreamKeep bool) bool {
	if upstreamKeep {
		cc.w.pool.release(u)
	} else {
		u.c.Close()
	}
	if _, err := cc.c.Write(out); err != nil {
		cc.c.Close()
		cc.gone()
		return false
	}
	return true
}

// broken: the sandbox's head is unusable; nothing was sent to the client yet: a 502.
func (cc *clientConn) broken(u *upConn, why string) bool {
	u.c.Close()
	cc.w.countRefusal()
	cc.refuse(fmt.Sprintf("The sandbox %s: %s", cc.sandbox, why))
	return false
}

// cut: the answer broke off after its head: the client's connection closes without the
// answer's end, so it sees a broken answer, never a complete one missing the sandbox's tail.
func (cc *clientConn) cut(u *upConn) bool {
	u.c.Close()
	cc.c.Close()
	cc.gone()
	return false
}

// refuse answers 502 with torpor's JSON error body and closes.
func (cc *clientConn) refuse(message string) {
	body := `{"code": 502, "message": ` + jsonString(message) + `}`
	line := cc.w.statusLines[502]
	out := string(line) + "content-type: application/json\r\ncontent-length: " +
		strconv.Itoa(len(body)) + "\r\nconnection: close\r\n\r\n" + body
	cc.c.Write([]byte(out))
	cc.c.Close()
	cc.gone()
}

func (cc *clientConn) gone() {
	cc.w.send(&message{Op: "closed", ID: cc.id}, nil)
}

// jsonString quotes s as Python's json.dumps does (ASCII only).
func jsonString(s string) string {
	out := []byte{'"'}
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			out = append(out, '\\', byte(r))
		case r == '\n':
			out = append(out, `\n`...)
		case r == '\r':
			out = append(out, `\r`...)
		case r == '\t':
			out = append(out, `\t`...)
		case r < 0x20 || r > 0x7e:
			if r > 0xffff {
				r1, r2 := (r-0x10000)>>10+0xd800, (r-0x10000)&0x3ff+0xdc00
				out = append(out, fmt.Sprintf(`\u%04x\u%04x`, r1, r2)...)
			} else {
				out = append(out, fmt.Sprintf(`\u%04x`, r)...)
			}
		default:
			out = append(out, byte(r))
		}
	}
	return string(append(out, '"'))
}

var (
	dateMu     sync.Mutex
	dateSecond int64
	dateValue  string
)

// httpDate is the Date header's value, formatted once per second.
func httpDate() string {
	now := time.Now()
	dateMu.Lock()
	defer dateMu.Unlock()
	if s := now.Unix(); s != dateSecond {
		dateSecond = s
		dateValue = now.UTC().Format("Mon, 02 Jan 2006 15:04:05 GMT")
	}
	return dateValue
}
