package tgsync

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// HAProxy drives one HAProxy backend through its Runtime API (a unix
// socket with `stats socket PATH level admin`). The backend holds a pool
// of slots from a server-template, e.g.
//
//	server-template slot 1-64 0.0.0.0:0 disabled
//
// A slot in maintenance is free; registering a target sets a free slot's
// address, port and weight and makes it ready; deregistering puts it back
// in maintenance (no new requests at once) and clears its address.
// Servers that are not slots of the pool are never touched: they are
// reported as unmanaged.
type HAProxy struct {
	socket, backend, prefix string
}

// NewHAProxy returns the backend for t.
func NewHAProxy(t HAProxyTarget) *HAProxy {
	prefix := t.SlotPrefix
	if prefix == "" {
		prefix = DefaultSlotPrefix
	}
	return &HAProxy{socket: t.Socket, backend: t.Backend, prefix: prefix}
}

// HAProxy server admin state bits (srv_admin_state in `show servers
// state`).
const (
	srvAdmForcedMaint   = 0x01
	srvAdmInheritMaint  = 0x02
	srvAdmForcedDrain   = 0x08
	srvAdmInheritDrain  = 0x10
	srvAdmResolverMaint = 0x20
	srvOpRunning        = 2
)

// Server is one row of `show servers state`.
type Server struct {
	Name    string
	Addr    string
	Port    int
	OpState int
	Admin   int
	Weight  int
}

// Maint reports whether the server is in maintenance (a free slot).
func (s Server) Maint() bool {
	return s.Admin&(srvAdmForcedMaint|srvAdmInheritMaint|srvAdmResolverMaint) != 0
}

// slot reports whether name is one of the pool's slots: prefix + digits.
func (h *HAProxy) slot(name string) bool {
	rest, ok := strings.CutPrefix(name, h.prefix)
	if !ok || rest == "" {
		return false
	}
	_, err := strconv.Atoi(rest)
	return err == nil
}

// Servers reads the backend's servers.
func (h *HAProxy) Servers(ctx context.Context) ([]Server, error) {
	out, err := h.command(ctx, "show servers state "+h.backend)
	if err != nil {
		return nil, err
	}
	return parseServersState(out, h.backend)
}

// parseServersState parses `show servers state BACKEND` (format 1).
func parseServersState(out, backend string) ([]Server, error) {
	var servers []Server
	sc := bufio.NewScanner(strings.NewReader(out))
	first := true
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if first {
			first = false
			if line != "1" {
				return nil, fmt.Errorf("haproxy: show servers state: %q (want format 1): %w", line, errHAProxy)
			}
			continue
		}
		f := strings.Fields(line)
		if len(f) < 19 || f[1] != backend {
			return nil, fmt.Errorf("haproxy: show servers state: unexpected line %q: %w", line, errHAProxy)
		}
		var s Server
		var errs [4]error
		s.Name, s.Addr = f[3], f[4]
		s.OpState, errs[0] = strconv.Atoi(f[5])
		s.Admin, errs[1] = strconv.Atoi(f[6])
		s.Weight, errs[2] = strconv.Atoi(f[7])
		s.Port, errs[3] = strconv.Atoi(f[18])
		if err := errors.Join(errs[:]...); err != nil {
			return nil, fmt.Errorf("haproxy: show servers state: line %q: %w", line, err)
		}
		servers = append(servers, s)
	}
	if first {
		return nil, fmt.Errorf("haproxy: backend %s: %q: %w", backend, strings.TrimSpace(out), errHAProxy)
	}
	return servers, nil
}

var errHAProxy = errors.New("haproxy runtime API")

// State reads the pool: every slot not in maintenance is a target.
// Servers outside the pool that take traffic are unmanaged.
func (h *HAProxy) State(ctx context.Context) (Group, error) {
	servers, err := h.Servers(ctx)
	if err != nil {
		return Group{}, err
	}
	g := Group{Ramps: true} // muster's ramping weights are applied
	for _, s := range servers {
		if s.Maint() {
			continue
		}
		st := "ready"
		switch {
		case s.OpState != srvOpRunning:
			st = "down"
		case s.Admin&(srvAdmForcedDrain|srvAdmInheritDrain) != 0:
			st = "drain"
		}
		have := Have{Key: Key{Addr: s.Addr, Port: s.Port}, Weight: s.Weight, Slot: s.Name, State: st}
		if h.slot(s.Name) {
			g.Targets = append(g.Targets, have)
		} else {
			g.Foreign = append(g.Foreign, have)
		}
	}
	return g, nil
}

// Register puts each target in a free slot: address and port, weight,
// then ready.
func (h *HAProxy) Register(ctx context.Context, ws []Want) error {
	servers, err := h.Servers(ctx)
	if err != nil {
		return err
	}
	var free []string
	slots := 0
	for _, s := range servers {
		if h.slot(s.Name) {
			slots++
			if s.Maint() {
				free = append(free, s.Name)
			}
		}
	}
	for i, w := range ws {
		if i >= len(free) {
			return fmt.Errorf("haproxy: backend %s: %d targets wait for a free slot (the pool has %d): raise the server-template's count: %w",
				h.backend, len(ws)-i, slots, errHAProxy)
		}
		srv := h.backend + "/" + free[i]
		if err := h.run(ctx,
			fmt.Sprintf("set server %s addr %s port %d", srv, w.Addr, w.Port),
			fmt.Sprintf("set server %s weight %d", srv, w.Weight),
			"set server "+srv+" state ready"); err != nil {
			return err
		}
	}
	return nil
}

// Reweight sets the weights of targets in the pool.
func (h *HAProxy) Reweight(ctx context.Context, ws []Want) error {
	g, err := h.State(ctx)
	if err != nil {
		return err
	}
	slot := map[Key]string{}
	for _, t := range g.Targets {
		slot[t.Key] = t.Slot
	}
	for _, w := range ws {
		name, ok := slot[w.Key]
		if !ok {
			continue // gone since the plan; the next cycle sees it
		}
		if err := h.run(ctx, fmt.Sprintf("set server %s/%s weight %d", h.backend, name, w.Weight)); err != nil {
			return err
		}
	}
	return nil
}

// Deregister puts targets' slots in maintenance: HAProxy sends them no
// new request from that moment.
func (h *HAProxy) Deregister(ctx context.Context, hs []Have) error {
	for _, t := range hs {
		if !h.slot(t.Slot) {
			return fmt.Errorf("haproxy: %s is not a slot of the pool %s*: %w", t.Slot, h.prefix, errHAProxy)
		}
		srv := h.backend + "/" + t.Slot
		if err := h.run(ctx, "set server "+srv+" state maint", "set server "+srv+" addr 0.0.0.0 port 0"); err != nil {
			return err
		}
	}
	return nil
}

// run sends commands in one connection and fails on an answer that is an
// error (the Runtime API answers set commands with nothing, or with a
// note of what changed).
func (h *HAProxy) run(ctx context.Context, cmds ...string) error {
	out, err := h.command(ctx, strings.Join(cmds, "; "))
	if err != nil {
		return err
	}
	for line := range strings.Lines(out) {
		l := strings.TrimSpace(line)
		if l == "" || strings.HasPrefix(l, "IP changed") || strings.HasPrefix(l, "no need to change") || strings.HasPrefix(l, "port changed") {
			continue
		}
		return fmt.Errorf("haproxy: %q: %s: %w", strings.Join(cmds, "; "), l, errHAProxy)
	}
	return nil
}

// command sends one line to the Runtime API (non-interactive: HAProxy
// answers and closes) and returns the answer.
func (h *HAProxy) command(ctx context.Context, line string) (string, error) {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", h.socket)
	if err != nil {
		return "", fmt.Errorf("haproxy: dial %s: %w", h.socket, err)
	}
	defer conn.Close()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(10 * time.Second)
	}
	_ = conn.SetDeadline(deadline)
	if _, err := io.WriteString(conn, line+"\n"); err != nil {
		return "", fmt.Errorf("haproxy: %s: %w", h.socket, err)
	}
	b, err := io.ReadAll(io.LimitReader(conn, 16<<20))
	if err != nil {
		return "", fmt.Errorf("haproxy: %s: read: %w", h.socket, err)
	}
	return string(b), nil
}
