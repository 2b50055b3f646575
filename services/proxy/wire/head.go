package main

// A strict HTTP/1.1 head parser. Strict on purpose: a client's request that is not plainly
// valid is handed back to the Python proxy (which answers exactly as it always did), and a
// sandbox's response that is not plainly valid is a 502. Nothing ambiguous is ever relayed.

import (
	"bytes"
	"errors"
)

var errBadHead = errors.New("malformed head")

type field struct {
	name  []byte // as sent
	lower []byte // lower-cased, for comparisons
	value []byte // without surrounding whitespace
}

type head struct {
	method  []byte
	target  []byte
	status  int
	minor   int // HTTP/1.<minor>
	reason  []byte
	headers []field
}

// tchar of RFC 9110 (token characters).
var tchar [256]bool

func init() {
	for c := '0'; c <= '9'; c++ {
		tchar[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		tchar[c] = true
		tchar[c-'a'+'A'] = true
	}
	for _, c := range []byte("!#$%&'*+-.^_`|~") {
		tchar[c] = true
	}
}

// headEnd returns the length of the head (through the blank line) in buf, or -1.
func headEnd(buf []byte, limit int) int {
	scan := buf
	if len(scan) > limit+4 {
		scan = scan[:limit+4]
	}
	i := bytes.Index(scan, []byte("\r\n\r\n"))
	if i < 0 {
		return -1
	}
	return i + 4
}

// parseRequest parses a request head (buf holds exactly the head, blank line included).
func parseRequest(buf []byte, maxHeaders int) (*head, error) {
	line, rest, ok := cutLine(buf)
	if !ok {
		return nil, errBadHead
	}
	sp1 := bytes.IndexByte(line, ' ')
	if sp1 <= 0 {
		return nil, errBadHead
	}
	method := line[:sp1]
	for _, c := range method {
		if !tchar[c] {
			return nil, errBadHead
		}
	}
	sp2 := bytes.IndexByte(line[sp1+1:], ' ')
	if sp2 <= 0 {
		return nil, errBadHead
	}
	target := line[sp1+1 : sp1+1+sp2]
	if target[0] != '/' {
		return nil, errBadHead // origin-form only
	}
	for _, c := range target {
		if c <= 0x20 || c >= 0x7f || c == '#' {
			return nil, errBadHead
		}
	}
	if !bytes.Equal(line[sp1+1+sp2+1:], []byte("HTTP/1.1")) {
		return nil, errBadHead
	}
	h := &head{method: method, target: target, minor: 1}
	if err := parseFields(rest, maxHeaders, h); err != nil {
		return nil, err
	}
	return h, nil
}

// parseResponse parses a response head (HTTP/1.0 or 1.1; a sandbox's server may be either).
func parseResponse(buf []byte, maxHeaders int) (*head, error) {
	line, rest, ok := cutLine(buf)
	if !ok || len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) {
		return nil, errBadHead
	}
	h := &head{}
	switch line[7] {
	case '0':
		h.minor = 0
	case '1':
		h.minor = 1
	default:
		return nil, errBadHead
	}
	if line[8] != ' ' {
		return nil, errBadHead
	}
	code := line[9:12]
	for _, c := range code {
		if c < '0' || c > '9' {
			return nil, errBadHead
		}
	}
	h.status = int(code[0]-'0')*100 + int(code[1]-'0')*10 + int(code[2]-'0')
	if h.status < 100 || h.status > 599 {
		return nil, errBadHead
	}
	if len(line) > 12 {
		if line[12] != ' ' {
			return nil, errBadHead
		}
		h.reason = line[13:]
		for _, c := range h.reason {
			if (c < 0x20 && c != '\t') || c == 0x7f {
				return nil, errBadHead
			}
		}
	}
	if err := parseFields(rest, maxHeaders, h); err != nil {
		return nil, err
	}
	return h, nil
}

func parseFields(buf []byte, maxHeaders int, h *head) error {
	for {
		line, rest, ok := cutLine(buf)
		if !ok {
			return errBadHead
		}
		buf = rest
		if len(line) == 0 {
			if len(buf) != 0 {
				return errBadHead
			}
			return nil
		}
		if len(h.headers) >= maxHeaders {
			return errBadHead
		}
		colon := bytes.IndexByte(line, ':')
		if colon <= 0 {
			return errBadHead // no name, or obs-fold (a line starting with whitespace)
		}
		name := line[:colon]
		for _, c := range name {
			if !tchar[c] {
				return errBadHead
			}
		}
		value := line[colon+1:]
		for _, c := range value {
			if (c < 0x20 && c != '\t') || c == 0x7f {
				return errBadHead // NUL, a bare CR, other controls
			}
		}
		h.headers = append(h.headers, field{name: name, lower: bytes.ToLower(name), value: trimOWS(value)})
	}
}

// cutLine splits off one CRLF-terminated line; a bare LF anywhere in it is malformed.
func cutLine(buf []byte) (line, rest []byte, ok bool) {
	i := bytes.IndexByte(buf, '\n')
	if i < 1 || buf[i-1] != '\r' {
		return nil, nil, false
	}
	line = buf[:i-1]
	if bytes.IndexByte(line, '\r') >= 0 {
		return nil, nil, false
	}
	return line, buf[i+1:], true
}

func trimOWS(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t') {
		b = b[:len(b)-1]
	}
	return b
}

// contentLength parses a Content-Length value: ASCII digits only, at most 18 of them.
func contentLength(v []byte) (int64, bool) {
	if len(v) == 0 || len(v) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
}

// hasToken reports whether a comma-separated header value lists tok (case-insensitively).
func hasToken(v []byte, tok string) bool {
	for _, part := range bytes.Split(v, []byte(",")) {
		if bytes.EqualFold(trimOWS(part), []byte(tok)) {
			return true
		}
	}
	return false
}
