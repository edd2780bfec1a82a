package webui

import (
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/stream"
)

// Live updates: a page marked data-live opens an EventSource on
// its events path, and refresh.js reloads the page's main content when a
// change event arrives, instead of waiting for its refresh interval.
// Without script the page is complete; the events only say "something
// changed", never what (the page is fetched again, with the reader's own
// authority).
const (
	// eventsCoalesce is the least time between two change events on one
	// stream: a burst of view changes is one reload.
	eventsCoalesce = time.Second
	// eventsLifetime ends a stream after a while; EventSource reconnects
	// by itself (a signed-out session is refused then).
	eventsLifetime = 10 * time.Minute
	// eventsHeartbeat keeps proxies from closing an idle stream.
	eventsHeartbeat = 25 * time.Second
	// maxEventStreams bounds the UI's open event streams on this replica.
	maxEventStreams = 500
	// maxEventStreamsPerViewer bounds one signed-in person's share of
	// them (all their sessions and tabs together), so that one viewer,
	// by script or by many tabs, cannot hold every stream and leave the
	// others on their refresh interval. Eight is more live pages than a
	// person watches at once; a ninth page still works, refreshed on its
	// interval.
	maxEventStreamsPerViewer = 8
)

// viewerStreams counts the open event streams per viewer (the
// principal's String) on this UI.
type viewerStreams struct {
	mu sync.Mutex
	by map[string]int
}

// acquire takes one of key's streams; false when key holds its share.
func (v *viewerStreams) acquire(key string) bool {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.by[key] >= maxEventStreamsPerViewer {
		return false
	}
	if v.by == nil {
		v.by = map[string]int{}
	}
	v.by[key]++
	return true
}

// release gives back one of key's streams.
func (v *viewerStreams) release(key string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.by[key]--; v.by[key] <= 0 {
		delete(v.by, key)
	}
}

// eventStreams counts the open event streams.
var eventStreams atomic.Int64

// events streams change events for one service (?service=NAME) or for
// every service the hub held views of when it opened.
func (u *UI) events(w http.ResponseWriter, r *http.Request) {
	viewer, ok := u.current(r)
	if !ok {
		http.Error(w, "sign in first", http.StatusUnauthorized)
		return
	}
	if u.cfg.Hub == nil {
		http.Error(w, "no live updates here", http.StatusNotFound)
		return
	}
	var names []string
	if name := r.URL.Query().Get("service"); name != "" {
		if !registry.ValidName(name) {
			http.Error(w, "service names are DNS labels", http.StatusBadRequest)
			return
		}
		names = []string{name}
	} else {
		names = u.cfg.Hub.Services()
	}
	key := viewer.String()
	if !u.streams.acquire(key) {
		w.Header().Set("Retry-After", "60")
		http.Error(w, fmt.Sprintf("you have %d live pages open on this replica, the most one person may; close one to make this one live, until then it refreshes on its interval", maxEventStreamsPerViewer), http.StatusTooManyRequests)
		return
	}
	defer u.streams.release(key)
	if eventStreams.Add(1) > maxEventStreams {
		eventStreams.Add(-1)
		w.Header().Set("Retry-After", "60")
		http.Error(w, "too many live pages open; the page refreshes on its interval", http.StatusServiceUnavailable)
		return
	}
	defer eventStreams.Add(-1)
	sub, err := u.cfg.Hub.Follow(names, 0)
	if err != nil {
		http.Error(w, "muster is shutting down", http.StatusServiceUnavailable)
		return
	}
	defer sub.Close()

	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	w.WriteHeader(http.StatusOK)
	write := func(s string) bool {
		_ = rc.SetWriteDeadline(time.Now().Add(10 * time.Second))
		if _, err := w.Write([]byte(s)); err != nil {
			return false
		}
		return rc.Flush() == nil
	}
	if !write("retry: 5000\n\n") {
		return
	}
	end := time.NewTimer(eventsLifetime)
	defer end.Stop()
	beat := time.NewTicker(eventsHeartbeat)
	defer beat.Stop()
	var (
		pending  = map[string]bool{}
		lastSent time.Time
		flush    <-chan time.Time
	)
	send := func() bool {
		for name := range pending {
			if !write("event: change\ndata: " + strconv.Quote(name) + "\n\n") {
				return false
			}
		}
		clear(pending)
		lastSent, flush = time.Now(), nil
		return true
	}
	note := func(f *stream.Frame) {
		if f.Kind == stream.KindView || f.Kind == stream.KindDelta {
			pending[f.Service] = true
		}
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case <-end.C:
			return
		case <-beat.C:
			if !write(": heartbeat\n\n") {
				return
			}
		case f, ok := <-sub.C():
			if !ok || f.Kind == stream.KindDrain {
				// The hub is closing (muster shutting down): end, so the
				// HTTP server's shutdown does not wait on this stream.
				return
			}
			note(f)
		case <-sub.Resync():
			for _, f := range sub.TakeResync() {
				note(f)
			}
		case <-flush:
			if !send() {
				return
			}
		}
		if len(pending) > 0 && flush == nil {
			if wait := eventsCoalesce - time.Since(lastSent); wait > 0 {
				flush = time.After(wait)
			} else if !send() {
				return
			}
		}
	}
}
