package main

import (
	"strings"
	"testing"
)

func TestRequestHeadsThatAreNotPlainAreRefused(t *testing.T) {
	bad := map[string]string{
		"nul in a value":         "GET / HTTP/1.1\r\nx: a\x00b\r\n\r\n",
		"bare CR in a value":     "GET / HTTP/1.1\r\nx: a\rb\r\n\r\n",
		"bare LF line":           "GET / HTTP/1.1\nx: a\r\n\r\n",
		"obs-fold":               "GET / HTTP/1.1\r\nx: a\r\n b\r\n\r\n",
		"space before colon":     "GET / HTTP/1.1\r\nx : a\r\n\r\n",
		"empty name":             "GET / HTTP/1.1\r\n: a\r\n\r\n",
		"HTTP/1.0":               "GET / HTTP/1.0\r\n\r\n",
		"HTTP/2 line":            "GET / HTTP/2.0\r\n\r\n",
		"absolute-form":          "GET http://x/ HTTP/1.1\r\n\r\n",
		"asterisk":               "OPTIONS * HTTP/1.1\r\n\r\n",
		"fragment":               "GET /a#b HTTP/1.1\r\n\r\n",
		"space in target":        "GET /a b HTTP/1.1\r\n\r\n",
		"control in target":      "GET /a\x01 HTTP/1.1\r\n\r\n",
		"non-token method":       "G(T / HTTP/1.1\r\n\r\n",
		"no method":              " / HTTP/1.1\r\n\r\n",
		"double space":           "GET  / HTTP/1.1\r\n\r\n",
		"trailing after version": "GET / HTTP/1.1 x\r\n\r\n",
		"DEL in a value":         "GET / HTTP/1.1\r\nx: a\x7f\r\n\r\n",
	}
	for name, raw := range bad {
		if h, err := parseRequest([]byte(raw), 100); err == nil {
			t.Errorf("%s: parsed as %q", name, h.target)
		}
	}
}

func TestAPlainRequestKeepsItsFields(t *testing.T) {
	raw := "POST /p?q=1 HTTP/1.1\r\nHost: h\r\nX-Access-Token:  tok \r\nContent-Length: 2\r\n\r\n"
	h, err := parseRequest([]byte(raw), 100)
	if err != nil {
		t.Fatal(err)
	}
	if string(h.method) != "POST" || string(h.target) != "/p?q=1" || len(h.headers) != 3 {
		t.Fatalf("got %q %q %d headers", h.method, h.target, len(h.headers))
	}
	if string(h.headers[1].lower) != "x-access-token" || string(h.headers[1].value) != "tok" {
		t.Fatalf("header: %q=%q", h.headers[1].lower, h.headers[1].value)
	}
	if _, err := parseRequest([]byte(raw), 2); err == nil {
		t.Fatal("more headers than the limit parsed")
	}
}

func TestResponseHeads(t *testing.T) {
	good := []string{
		"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n",
		"HTTP/1.0 200 OK\r\n\r\n",
		"HTTP/1.1 204\r\n\r\n",
		"HTTP/1.1 299 \r\n\r\n",
	}
	for _, raw := range good {
		if _, err := parseResponse([]byte(raw), 100); err != nil {
			t.Errorf("%q: %v", raw, err)
		}
	}
	bad := []string{
		"HTTP/1.1 200 OK\r\nx: a\x00\r\n\r\n",
		"HTTP/1.1 200 OK\nx: a\n\n",
		"HTTP/1.1 20 OK\r\n\r\n",
		"HTTP/1.1 600 OK\r\n\r\n",
		"HTTP/1.1 099 OK\r\n\r\n",
		"HTTP/1.2 200 OK\r\n\r\n",
		"HTTP/1.1 200 O\x01K\r\n\r\n",
		"ICY 200 OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nx: a\r\n folded\r\n\r\n",
		"HTTP/1.1 200 OK\r\n" + strings.Repeat("x: y\r\n", 101) + "\r\n",
	}
	for _, raw := range bad {
		if _, err := parseResponse([]byte(raw), 100); err == nil {
			t.Errorf("%q parsed", raw)
		}
	}
}

func TestContentLength(t *testing.T) {
	for v, want := range map[string]int64{"0": 0, "007": 7, "123456789012345678": 123456789012345678} {
		if n, ok := contentLength([]byte(v)); !ok || n != want {
			t.Errorf("%q: %d %v", v, n, ok)
		}
	}
	for _, v := range []string{"", "-1", "+1", "1 ", "0x10", "1234567890123456789", "١"} {
		if _, ok := contentLength([]byte(v)); ok {
			t.Errorf("%q accepted", v)
		}
	}
}

func TestJSONStringMatchesPython(t *testing.T) {
	cases := map[string]string{
		`a"b\c`:   `"a\"b\\c"`,
		"é\n\x01": `"\u00e9\n\u0001"`,
		"😀":       `"\ud83d\ude00"`,
	}
	for in, want := range cases {
		if got := jsonString(in); got != want {
			t.Errorf("%q: %s, want %s", in, got, want)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add([]byte("GET / HTTP/1.1\r\nHost: h\r\n\r\n"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		h, err := parseRequest(raw, 100)
		if err != nil {
			return
		}
		for _, fl := range h.headers {
			for _, c := range fl.value {
				if c == '\r' || c == '\n' || c == 0 {
					t.Fatalf("a control byte in a parsed value: %q", fl.value)
				}
			}
		}
	})
}
