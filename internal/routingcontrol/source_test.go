package routingcontrol

import (
	"context"
	"encoding/pem"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// writeAtomic replaces path by renaming a new file over it, as a
// deployment tool (or kubelet's ConfigMap update) does.
func writeAtomic(t *testing.T, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// TestFileSourceRotation: a file replaced by an atomic rename is read at
// the next read; a missing or broken file fails static.
func TestFileSourceRotation(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "controls.json")
	writeAtomic(t, path, `{"regions":{"us-east-1":"on","eu-west-1":"on"}}`)
	src, err := ParseSource("file:"+path, "", 0)
	if err != nil {
		t.Fatal(err)
	}
	c, clock := newControls(t, src, nil, nil)
	ctx := context.Background()
	c.RunOnce(ctx)
	if !c.On("eu-west-1") || c.Status().Revision == "" {
		t.Fatalf("first read: %+v", c.Status())
	}
	writeAtomic(t, path, `{"regions":{"us-east-1":"on","eu-west-1":"off"}}`)
	clock.Advance(5 * time.Second)
	c.RunOnce(ctx)
	if c.On("eu-west-1") {
		t.Fatal("the renamed-in file was not read")
	}
	for content, reason := range map[string]string{
		`{"regions":{"eu-west-1":"of"}}`:        ReasonMalformed,
		strings.Repeat(" ", MaxDocumentBytes+1): ReasonTooLarge,
		"":                                      ReasonMissing,
	} {
		if content == "" {
			if err := os.Remove(path); err != nil {
				t.Fatal(err)
			}
		} else {
			writeAtomic(t, path, content)
		}
		clock.Advance(5 * time.Second)
		c.RunOnce(ctx)
		if c.On("eu-west-1") || !strings.HasPrefix(c.Status().LastError, reason+":") {
			t.Fatalf("%s: on %v, status %+v", reason, c.On("eu-west-1"), c.Status())
		}
	}
	// YAML by its extension.
	ypath := filepath.Join(dir, "controls.yaml")
	writeAtomic(t, ypath, "regions:\n  eu-west-1: off\n  us-east-1: on\n")
	got, err := (&FileSource{Path: ypath}).Read(ctx, "")
	if err != nil || !cmp.Equal(got.Regions, map[string]State{"eu-west-1": Off, "us-east-1": On}) {
		t.Fatalf("YAML file: %+v, %v", got, err)
	}
}

// controlServer is an HTTPS routing-control endpoint over real TLS on
// loopback: it serves body with an ETag, answers 304 to a matching
// If-None-Match, and can be made to fail or hang.
type controlServer struct {
	mu      sync.Mutex
	body    string
	status  int
	hang    chan struct{}
	hits    int
	matched int
}

func (s *controlServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.hits++
	body, status, hang := s.body, s.status, s.hang
	s.mu.Unlock()
	if hang != nil {
		select {
		case <-hang:
		case <-r.Context().Done():
			// Close without a response: a handler that returned here
			// would answer an empty 200, and a client whose timeout
			// raced its own close of the connection could read that
			// instead of its timeout.
			panic(http.ErrAbortHandler)
		}
		return
	}
	if status != 0 {
		http.Error(w, "broken", status)
		return
	}
	etag := fmt.Sprintf(`"%x"`, len(body)*31+int(body[len(body)-3]))
	if r.Header.Get("If-None-Match") == etag {
		s.mu.Lock()
		s.matched++
		s.mu.Unlock()
		w.WriteHeader(http.StatusNotModified)
		return
	}
	w.Header().Set("ETag", etag)
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write([]byte(body))
}

func (s *controlServer) set(f func(s *controlServer)) { s.mu.Lock(); f(s); s.mu.Unlock() }

// TestHTTPSource: over real TLS with the server's certificate as the CA
// bundle; ETag and 304; a 500 and a hanging server fail static and, past
// the threshold, stale; the system roots refuse the test certificate.
func TestHTTPSource(t *testing.T) {
	t.Parallel()
	cs := &controlServer{body: `{"regions":{"us-east-1":"on","eu-west-1":"off"}}`}
	srv := httptest.NewTLSServer(cs)
	t.Cleanup(srv.Close)
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srv.Certificate().Raw}), 0o600); err != nil {
		t.Fatal(err)
	}
	src, err := ParseSource(srv.URL+"/controls", ca, 300*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	c, clock := newControls(t, src, nil, nil)
	ctx := context.Background()
	c.RunOnce(ctx)
	if c.On("eu-west-1") || !strings.HasPrefix(c.Status().Revision, `"`) {
		t.Fatalf("first read: %+v", c.Status())
	}
	clock.Advance(5 * time.Second)
	c.RunOnce(ctx)
	if matched := func() int { cs.mu.Lock(); defer cs.mu.Unlock(); return cs.matched }(); matched != 1 || c.On("eu-west-1") || c.Status().LastError != "" {
		t.Fatalf("second read: %d 304s, status %+v", matched, c.Status())
	}
	cs.set(func(s *controlServer) { s.status = http.StatusInternalServerError })
	clock.Advance(5 * time.Second)
	c.RunOnce(ctx)
	if c.On("eu-west-1") || !strings.HasPrefix(c.Status().LastError, ReasonStatus+":") || c.Status().Stale {
		t.Fatalf("after a 500: %+v", c.Status())
	}
	hang := make(chan struct{})
	t.Cleanup(func() { close(hang) })
	cs.set(func(s *controlServer) { s.status, s.hang = 0, hang })
	for range 3 {
		clock.Advance(5 * time.Second)
		start := time.Now()
		c.RunOnce(ctx)
		if took := time.Since(start); took > 2*time.Second {
			t.Fatalf("a hanging server held a read for %s", took)
		}
	}
	st := c.Status()
	if c.On("eu-west-1") || !st.Stale || !strings.HasPrefix(st.LastError, ReasonTimeout+":") || !cmp.Equal(kinds(c), []string{AlarmStale}) {
		t.Fatalf("a hanging server for 20 s: %+v, alarms %v", st, kinds(c))
	}
	cs.set(func(s *controlServer) { s.hang, s.body = nil, `{"regions":{"us-east-1":"on","eu-west-1":"on"}}` })
	clock.Advance(5 * time.Second)
	c.RunOnce(ctx)
	if !c.On("eu-west-1") || c.Status().Stale {
		t.Fatalf("back: %+v", c.Status())
	}

	// A redirect to clear text is not followed.
	plainSrv := httptest.NewServer(cs)
	t.Cleanup(plainSrv.Close)
	redirect := httptest.NewTLSServer(http.RedirectHandler(plainSrv.URL, http.StatusFound))
	t.Cleanup(redirect.Close)
	down := &HTTPSource{URL: redirect.URL, Client: src.(*HTTPSource).Client}
	down.Client.Transport.(*http.Transport).TLSClientConfig.RootCAs.AddCert(redirect.Certificate())
	if _, err := down.Read(ctx, ""); err == nil || !strings.Contains(err.Error(), "only https is followed") {
		t.Fatalf("a redirect to http: %v", err)
	}

	// Without the CA bundle, the test certificate is not trusted.
	plain, err := ParseSource(srv.URL, "", time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := plain.Read(ctx, ""); err == nil || ReasonOf(err) != ReasonUnreachable {
		t.Fatalf("an untrusted certificate: %v", err)
	}
}

func TestParseSource(t *testing.T) {
	t.Parallel()
	ca := filepath.Join(t.TempDir(), "ca.pem")
	if err := os.WriteFile(ca, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec, ca string
		kind     string // "" for an error
		location string
	}{
		{"file:/etc/muster/controls.json", "", "file", "/etc/muster/controls.json"},
		{"https://controls.example.org/v1", "", "https", "https://controls.example.org/v1"},
		{"dns:_muster-routing.example.org@127.0.0.1:5353", "", "dns", "_muster-routing.example.org@127.0.0.1:5353"},
		{"dns:_muster-routing.example.org", "", "dns", "_muster-routing.example.org"},
		{"file:", "", "", ""},
		{"http://controls.example.org/", "", "", ""},
		{"https://user:pw@controls.example.org/", "", "", ""},
		{"https://controls.example.org/", ca, "", ""},
		{"https://controls.example.org/", "/nonexistent/ca.pem", "", ""},
		{"file:/x.json", ca, "", ""},
		{"dns:", "", "", ""},
		{"dns:name@nohostport", "", "", ""},
		{"controls.json", "", "", ""},
	} {
		src, err := ParseSource(tc.spec, tc.ca, time.Second)
		switch {
		case tc.kind == "" && err == nil:
			t.Errorf("%q (ca %q): accepted", tc.spec, tc.ca)
		case tc.kind != "" && err != nil:
			t.Errorf("%q: %v", tc.spec, err)
		case tc.kind != "" && (src.Kind() != tc.kind || src.Location() != tc.location):
			t.Errorf("%q: %s %s", tc.spec, src.Kind(), src.Location())
		}
	}
}

// TestReasonOf: unclassified errors are unreachable.
func TestReasonOf(t *testing.T) {
	t.Parallel()
	if ReasonOf(errors.New("x")) != ReasonUnreachable || ReasonOf(fmt.Errorf("w: %w", &ReadError{Reason: ReasonMissing, Err: errors.New("x")})) != ReasonMissing {
		t.Error("ReasonOf")
	}
}
