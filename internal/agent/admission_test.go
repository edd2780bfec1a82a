package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/musterhq/muster/internal/agent"
	"github.com/musterhq/muster/internal/stream"
	"github.com/musterhq/muster/internal/wait"
)

// openWatch opens a local watch of services and returns its status, its
// problem type (on a refusal), its Retry-After, and a function closing
// it.
func openWatch(t *testing.T, base string, services ...string) (status int, problemType string, retryAfter int, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	q := make([]string, len(services))
	for i, s := range services {
		q[i] = "service=" + s
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/v1/watch?"+strings.Join(q, "&"), nil)
	if err != nil {
		t.Fatal(err)
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	stop = func() { cancel(); res.Body.Close() }
	if res.StatusCode != http.StatusOK {
		var p struct{ Type string }
		_ = json.NewDecoder(res.Body).Decode(&p)
		retryAfter, _ = strconv.Atoi(res.Header.Get("Retry-After"))
		stop()
		return res.StatusCode, p.Type, retryAfter, func() {}
	}
	t.Cleanup(stop)
	return res.StatusCode, "", 0, stop
}

// openXDS opens a local delta xDS stream subscribed to service and
// returns a function closing it and the first response's error (nil:
// the stream is open and answered).
func openXDS(t *testing.T, addr, service string) (stop func(), err error) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	stop = func() { cancel(); conn.Close() }
	t.Cleanup(stop)
	st, err := discovery.NewAggregatedDiscoveryServiceClient(conn).DeltaAggregatedResources(ctx)
	if err != nil {
		return stop, err
	}
	// A stream the server refused at once ends before the request is
	// sent: Send then says only io.EOF, and the status (the refusal) is
	// Recv's to return, as gRPC's stream contract has it.
	if err := st.Send(&discovery.DeltaDiscoveryRequest{TypeUrl: resource.EndpointType, ResourceNamesSubscribe: []string{service}}); err != nil && !errors.Is(err, io.EOF) {
		return stop, err
	}
	_, err = st.Recv()
	return stop, err
}

// TestAgentAdmitsLocalStreams: the agent's local streams pass the same
// reconnect admission as muster's own (one budget per window for xDS and
// watch together; a refused watch gets 503 "admission" with a
// Retry-After, a refused xDS stream RESOURCE_EXHAUSTED), and at most
// MaxStreams are open at once on each surface. A refused watch asks
// nothing of muster (the set it follows is unchanged), and the refusals
// are in the agent's metrics.
func TestAgentAdmitsLocalStreams(t *testing.T) {
	t.Parallel()
	w := newWeb(t, "a1")
	scrape := func(r *running) string { _, b := get(t, r.httpURL+"/metrics"); return string(b) }
	has := func(t *testing.T, metrics string, res ...string) {
		t.Helper()
		for _, re := range res {
			if !regexp.MustCompile(`(?m)^` + re + `$`).MatchString(metrics) {
				t.Errorf("metrics lack %s", re)
			}
		}
	}

	t.Run("admission", func(t *testing.T) {
		// Three (re)subscriptions per hour-long window: the window never
		// turns within the test.
		ag := startAgentWith(t, w.agentConfig(w.URL, t.TempDir(), "web"), "127.0.0.1:0", agent.ServerConfig{
			Admission: stream.AdmissionConfig{Floor: 3, Window: time.Hour},
		})
		for i := range 2 {
			if st, typ, _, _ := openWatch(t, ag.httpURL, "web"); st != http.StatusOK {
				t.Fatalf("watch %d: %d %s; want admitted", i+1, st, typ)
			}
		}
		if _, err := openXDS(t, ag.xdsAddr, "web"); err != nil {
			t.Fatalf("the third stream, xDS: %v; want admitted", err)
		}
		st, typ, retry, _ := openWatch(t, ag.httpURL, "web", "api")
		if st != http.StatusServiceUnavailable || !strings.HasSuffix(typ, "/admission") || retry < 1 {
			t.Fatalf("the fourth stream, a watch: %d %q Retry-After %d; want 503 admission with a Retry-After", st, typ, retry)
		}
		if got := ag.a.Services(); !slices.Equal(got, []string{"web"}) {
			t.Fatalf("a refused watch changed the set the agent follows: %v", got)
		}
		_, err := openXDS(t, ag.xdsAddr, "web")
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("the fifth stream, xDS: %v; want RESOURCE_EXHAUSTED", err)
		}
		has(t, scrape(ag), `muster_agent_watch_admission_refused_total 1`, `muster_xds_admission_refused_total 1`,
			`muster_agent_admission_budget 3`, `muster_agent_admitted_window 3`, `muster_agent_admitted_total 3`)
	})

	t.Run("max streams", func(t *testing.T) {
		ag := startAgentWith(t, w.agentConfig(w.URL, t.TempDir(), "web"), "127.0.0.1:0", agent.ServerConfig{MaxStreams: 1})
		st, _, _, stop := openWatch(t, ag.httpURL, "web")
		if st != http.StatusOK {
			t.Fatalf("the first watch: %d", st)
		}
		if st, typ, retry, _ := openWatch(t, ag.httpURL, "web"); st != http.StatusServiceUnavailable || !strings.HasSuffix(typ, "/too-many-streams") || retry < 1 {
			t.Fatalf("a second watch with one open: %d %q Retry-After %d; want 503 too-many-streams", st, typ, retry)
		}
		stopXDS, err := openXDS(t, ag.xdsAddr, "web")
		if err != nil {
			t.Fatalf("the first xDS stream: %v", err)
		}
		if _, err := openXDS(t, ag.xdsAddr, "web"); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("a second xDS stream with one open: %v; want RESOURCE_EXHAUSTED", err)
		}
		has(t, scrape(ag), `muster_agent_watch_streams_refused_total 1`, `muster_xds_refused_total\{reason="streams_per_principal"\} 1`)
		// The cap is on streams open, not opened: once one ends,
		// another is taken.
		stop()
		stopXDS()
		wait.For(t, 10*time.Second, "a watch taken once the first ended", func() bool {
			st, _, _, _ := openWatch(t, ag.httpURL, "web")
			return st == http.StatusOK
		})
		wait.For(t, 10*time.Second, "an xDS stream taken once the first ended", func() bool {
			_, err := openXDS(t, ag.xdsAddr, "web")
			return err == nil
		})
	})
}
