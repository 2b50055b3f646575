// torpor-wire: the proxy's compiled data path (services/proxy/wire.py starts it).
//
// The Python proxy decides everything about a client connection on its first exchange
// (routing, the token, waking a paused sandbox, limits) and then hands the connection's file
// descriptor here with what it decided. This program serves the connection's next requests as
// long as each is a plain one for the same sandbox port with the same token; anything else
// (another sandbox, another credential, a head in pieces, a body that is slow, an upgrade, a
// refused upstream connection...) goes back to the Python proxy, unanswered and with every
// byte read so far, so it answers exactly as if this program did not exist.
//
// Control: the descriptor named by the only argument is a SOCK_SEQPACKET Unix socket to the Python proxy; one JSON message per
// packet, client connections travel as SCM_RIGHTS.
package main

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"syscall"
	"time"
)

type config struct {
	StatusLines    map[string]string `json:"status_lines"`
	DefaultHeaders [][2]string       `json:"default_headers"`
	Date           bool              `json:"date"`
	HopByHop       []string          `json:"hop_by_hop"`
	NotForwarded   []string          `json:"not_forwarded"`
	MaxHead        int               `json:"max_head"`
	MaxHeaders     int               `json:"max_headers"`
	MaxBody        int64             `json:"max_body"`
	KeepAlive      float64           `json:"keep_alive"`
	BodyGrace      float64           `json:"body_grace"`
	UpstreamLimit  int               `json:"upstream_limit"`
	IdleExpiry     float64           `json:"idle_expiry"`
	MaxRespHead    int               `json:"max_response_head"`
	MaxRespHeaders int               `json:"max_response_headers"`
}

type message struct {
	Op        string    `json:"op"`
	ID        uint64    `json:"id,omitempty"`
	Client    string    `json:"client,omitempty"`
	Sandbox   string    `json:"sandbox,omitempty"`
	Port      int       `json:"port,omitempty"`
	Upstream  string    `json:"upstream,omitempty"`
	Routing   []*[]byte `json:"routing,omitempty"` // e2b-sandbox-id, e2b-sandbox-port, host; null: absent
	Token     string    `json:"token,omitempty"`   // hex SHA-256 of the sandbox's access token
	APIKeys   bool      `json:"api_keys,omitempty"`
	Daemon    bool      `json:"daemon,omitempty"`
	Activity  bool      `json:"activity,omitempty"`
	Data      []byte    `json:"data,omitempty"`
	Sandboxes []string  `json:"sandboxes,omitempty"`
	Latencies []float64 `json:"latencies,omitempty"`
	Refused   int       `json:"refused,omitempty"`
	Config    *config   `json:"config,omitempty"`
}

// wire is the program's state.
type wire struct {
	cfg          *config
	statusLines  map[int][]byte
	defaultHead  []byte
	hopByHop     map[string]bool
	notForwarded map[string]bool
	control      *net.UnixConn
	sendMu       sync.Mutex
	pool         *pool

	mu        sync.Mutex
	gen       map[string]uint64 // per sandbox: bumped by "forget"
	conns     map[uint64]*clientConn
	seen      map[string]bool
	latencies []float64
	refused   int
	stopping  bool
	active    sync.WaitGroup
}

func main() {
	fd := -1
	if len(os.Args) == 2 {
		fd, _ = strconv.Atoi(os.Args[1])
	}
	if fd < 3 {
		fmt.Fprintln(os.Stderr, "usage: torpor-wire CONTROL_FD (started by the torpor proxy)")
		os.Exit(2)
	}
	f := os.NewFile(uintptr(fd), "control")
	c, err := net.FileConn(f)
	if err != nil {
		fmt.Fprintln(os.Stderr, "torpor-wire: the control descriptor is not a socket:", err)
		os.Exit(2)
	}
	f.Close()
	control, ok := c.(*net.UnixConn)
	if !ok {
		fmt.Fprintln(os.Stderr, "torpor-wire: fd 3 is not a Unix socket")
		os.Exit(2)
	}
	w := &wire{control: control, gen: map[string]uint64{}, conns: map[uint64]*clientConn{}, seen: map[string]bool{}}
	signals := make(chan os.Signal, 1)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT)
	done := make(chan struct{})
	go func() {
		w.readControl()
		close(done)
	}()
	go w.reportLoop()
	select {
	case <-signals:
	case <-done:
	}
	w.shutdown()
}

// readControl handles the Python proxy's messages until the socket closes.
func (w *wire) readControl() {
	buf := make([]byte, 1<<20)
	oob := make([]byte, syscall.CmsgSpace(4*4))
	for {
		n, oobn, _, _, err := w.control.ReadMsgUnix(buf, oob)
		if err != nil || n == 0 {
			return
		}
		fds := receivedFds(oob[:oobn])
		var m message
		if err := json.Unmarshal(buf[:n], &m); err != nil {
			fmt.Fprintln(os.Stderr, "torpor-wire: bad control message:", err)
			closeFds(fds)
			continue
		}
		switch m.Op {
		case "config":
			if m.Config == nil || w.cfg != nil {
				closeFds(fds)
				continue
			}
			w.configure(m.Config)
		case "adopt":
			if len(fds) != 1 || w.cfg == nil {
				closeFds(fds)
				continue
			}
			w.adopt(&m, fds[0])
		case "forget":
			w.forget(m.Sandbox)
			closeFds(fds)
		default:
			closeFds(fds)
		}
	}
}

func (w *wire) configure(c *config) {
	w.statusLines = map[int][]byte{}
	for k, v := range c.StatusLines {
		var code int
		fmt.Sscanf(k, "%d", &code)
		w.statusLines[code] = []byte(v)
	}
	for _, h := range c.DefaultHeaders {
		w.defaultHead = append(w.defaultHead, h[0]+": "+h[1]+"\r\n"...)
	}
	w.hopByHop = set(c.HopByHop)
	w.notForwarded = set(c.NotForwarded)
	w.pool = newPool(c.UpstreamLimit, time.Duration(c.IdleExpiry*float64(time.Second)))
	w.cfg = c
}

func set(items []string) map[string]bool {
	s := map[string]bool{}
	for _, i := range items {
		s[i] = true
	}
	return s
}

func receivedFds(oob []byte) []int {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := syscall.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	return fds
}

func closeFds(fds []int) {
	for _, fd := range fds {
		syscall.Close(fd)
	}
}

func (w *wire) adopt(m *message, fd int) {
	f := os.NewFile(uintptr(fd), "client")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		w.send(&message{Op: "closed", ID: m.ID}, nil)
		return
	}
	tcp, ok := c.(*net.TCPConn)
	if !ok || len(m.Routing) != 3 {
		c.Close()
		w.send(&message{Op: "closed", ID: m.ID}, nil)
		return
	}
	w.mu.Lock()
	if w.stopping {
		w.mu.Unlock()
		w.giveBack(m.ID, tcp, nil)
		return
	}
	cc := newClientConn(w, m, tcp, w.gen[m.Sandbox])
	w.conns[m.ID] = cc
	w.active.Add(1)
	w.mu.Unlock()
	go cc.serve()
}

// forget: the sandbox's record changed; its connections go back to the Python proxy at their
// next request, and idle upstream connections to it are dropped.
func (w *wire) forget(sandbox string) {
	w.mu.Lock()
	w.gen[sandbox]++
	var keys []string
	for _, cc := range w.conns {
		if cc.sandbox == sandbox {
			keys = append(keys, cc.upstreamKey) // checked at its next request
		}
	}
	w.mu.Unlock()
	for _, k := range keys {
		w.pool.drop(k)
	}
}

func (w *wire) current(sandbox string, gen uint64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return !w.stopping && w.gen[sandbox] == gen
}

func (w *wire) done(cc *clientConn) {
	w.mu.Lock()
	delete(w.conns, cc.id)
	w.mu.Unlock()
	w.active.Done()
}

// giveBack returns a client connection, with the bytes read from it and not answered, to the
// Python proxy. The descriptor is duplicated into the message; ours is closed (no shutdown:
// the connection stays open in the Python proxy).
func (w *wire) giveBack(id uint64, c *net.TCPConn, data []byte) {
	f, err := c.File()
	c.Close()
	if err != nil {
		w.send(&message{Op: "closed", ID: id}, nil)
		return
	}
	defer f.Close()
	if !w.send(&message{Op: "return", ID: id, Data: data}, syscall.UnixRights(int(f.Fd()))) {
		return
	}
}

func (w *wire) send(m *message, oob []byte) bool {
	b, err := json.Marshal(m)
	if err != nil {
		return false
	}
	w.sendMu.Lock()
	defer w.sendMu.Unlock()
	_, _, err = w.control.WriteMsgUnix(b, oob, nil)
	return err == nil
}

// exchanged records one relayed exchange for the next report.
func (w *wire) exchanged(sandbox string, activity bool, waited time.Duration) {
	w.mu.Lock()
	if activity {
		w.seen[sandbox] = true
	}
	if len(w.latencies) < 10000 {
		w.latencies = append(w.latencies, waited.Seconds())
	}
	w.mu.Unlock()
}

func (w *wire) countRefusal() {
	w.mu.Lock()
	w.refused++
	w.mu.Unlock()
}

// reportLoop sends activity (for the sandboxes' timeouts) and metrics a few times a second.
func (w *wire) reportLoop() {
	for range time.Tick(200 * time.Millisecond) {
		w.report()
	}
}

func (w *wire) report() {
	w.mu.Lock()
	if len(w.seen) == 0 && len(w.latencies) == 0 && w.refused == 0 {
		w.mu.Unlock()
		return
	}
	m := &message{Op: "seen", Latencies: w.latencies, Refused: w.refused}
	for s := range w.seen {
		m.Sandboxes = append(m.Sandboxes, s)
	}
	w.seen = map[string]bool{}
	w.latencies = nil
	w.refused = 0
	w.mu.Unlock()
	w.send(m, nil)
}

// shutdown: idle connections close, exchanges under way finish (bounded), then exit.
func (w *wire) shutdown() {
	w.mu.Lock()
	w.stopping = true
	for _, cc := range w.conns {
		cc.wake()
	}
	w.mu.Unlock()
	finished := make(chan struct{})
	go func() {
		w.active.Wait()
		close(finished)
	}()
	select {
	case <-finished:
	case <-time.After(10 * time.Second):
	}
	w.report()
	os.Exit(0)
}
