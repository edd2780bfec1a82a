package server

import (
	"net/http"
	"time"

	"github.com/musterhq/muster/internal/relay"
)

// peerUpdates streams this replica's own publications to a peer (issue
// 27; internal/relay): a snapshot record per view it holds, then an
// update record per publication, a fresh snapshot when the peer fell so
// far behind that its tap overflowed, and a heartbeat every
// PeerHeartbeat. It ends when the hub closes (shutdown) or the peer goes
// away.
func (s *Server) peerUpdates(w http.ResponseWriter, r *http.Request) {
	hub := s.cfg.Hub
	select {
	case <-hub.Closing():
		p := problem(http.StatusServiceUnavailable, "draining", "this server is shutting down; reconnect with jitter")
		p.retryAfter = 1
		writeProblem(w, r, p)
		return
	default:
	}
	// The tap before the snapshot, so that nothing published in between
	// is missed (what both carry arrives twice; the peer's hub drops the
	// second).
	tap := hub.Tap(s.cfg.PeerTapLimit)
	defer tap.Close()
	s.streams.add()
	defer s.streams.done()

	h := w.Header()
	h.Set("Content-Type", "application/x-ndjson")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	// The server's read timeout would cancel this long-lived request.
	_ = rc.SetReadDeadline(time.Time{})
	send := func(b []byte) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(s.cfg.WatchWriteTimeout))
		if _, err := w.Write(b); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !send(nil) {
		return
	}
	peerID, _ := r.Context().Value(peerKey{}).(string)
	const chunk = 256 << 10
	var buf []byte
	// flush sends buf once it holds a chunk (or always, when all).
	flush := func(all bool) bool {
		if len(buf) == 0 || (!all && len(buf) < chunk) {
			return true
		}
		ok := send(buf)
		buf = buf[:0]
		return ok
	}
	snapshot := func() bool {
		for _, f := range hub.Snapshot() {
			var err error
			if buf, err = relay.AppendSnapshot(buf, f); err != nil {
				s.log.Error("a view cannot be relayed", "service", f.Service, "version", f.Version, "peer", peerID, "err", err)
				continue
			}
			if !flush(false) {
				return false
			}
		}
		return flush(true)
	}
	if !snapshot() {
		return
	}
	beat := time.NewTicker(s.cfg.PeerHeartbeat)
	defer beat.Stop()
	for {
		select {
		case <-r.Context().Done():
			return
		case <-hub.Closing():
			return
		case <-beat.C:
			if !send(relay.Heartbeat) {
				return
			}
		case <-tap.Wake():
			updates, resync := tap.Take()
			if resync {
				s.log.Warn("a peer fell behind this replica's publications: sending a snapshot again", "peer", peerID)
				if !snapshot() {
					return
				}
			}
			for _, u := range updates {
				var err error
				if buf, err = relay.AppendUpdate(buf, u); err != nil {
					s.log.Error("an update cannot be relayed", "service", u.View.Service, "peer", peerID, "err", err)
					continue
				}
				if !flush(false) {
					return
				}
			}
			if !flush(true) {
				return
			}
		}
	}
}

// Peer-stream defaults.
const (
	// DefaultPeerHeartbeat is the idle peer stream's heartbeat period.
	DefaultPeerHeartbeat = 2 * time.Second
)
