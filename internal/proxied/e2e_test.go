package proxied_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/app/apptest"
	"github.com/musterhq/muster/internal/devissuer"
	"github.com/musterhq/muster/internal/identity"
	"github.com/musterhq/muster/internal/proxied"
	"github.com/musterhq/muster/internal/registry"
)

// lb is the load balancer the test plays: it connects from 127.0.0.2 (on
// Linux all of 127.0.0.0/8 is loopback), the only network muster takes
// PROXY headers from here, while the stack's own requests come from
// 127.0.0.1 as ever.
var lb = netip.MustParseAddr("127.0.0.2")

// proxiedClient is an HTTP client whose every request goes on a new
// connection from local that opens with write (a PROXY header, say) when
// it is set: a real client side of the protocol, as a load balancer is.
func proxiedClient(local netip.Addr, write func(net.Conn) error) *http.Client {
	d := &net.Dialer{LocalAddr: net.TCPAddrFromAddrPort(netip.AddrPortFrom(local, 0)), Timeout: 5 * time.Second}
	return &http.Client{Timeout: 20 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			c, err := d.DialContext(ctx, network, addr)
			if err != nil || write == nil {
				return c, err
			}
			if err := write(c); err != nil {
				c.Close()
				return nil, err
			}
			return c, nil
		},
	}}
}

// from writes the PROXY v2 header of a client at src.
func from(src string) func(net.Conn) error { return writeHeader(v2(src)) }

type answer struct {
	status int
	body   string
	err    error
}

func send(t *testing.T, c *http.Client, method, url, token, body string, h http.Header) answer {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	for k, vs := range h {
		req.Header[k] = vs
	}
	res, err := c.Do(req)
	if err != nil {
		return answer{err: err}
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return answer{status: res.StatusCode, body: string(b), err: err}
}

// TestAddressProvedThroughLoadBalancer: behind a load balancer sending
// PROXY v2, a workload at 10.9.8.7 registers and self-reports as that
// address, through the real server; the header is believed from the
// load balancer's network only, and is required there.
func TestAddressProvedThroughLoadBalancer(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	st := apptest.New(t, apptest.Options{WatchHeartbeat: 50 * time.Millisecond, Listener: func(ln net.Listener) (net.Listener, error) {
		return proxied.Wrap(ln, proxied.Config{From: []netip.Prefix{netip.PrefixFrom(lb, 32)}, Metrics: reg})
	}})
	st.Seed(t)
	// The workload's token vouches for no address: only where it
	// connects from proves it.
	web := st.Token(t, devissuer.TokenRequest{Kind: identity.KindWorkload, Service: "web"})
	registration := `{"address":"10.9.8.7","port":8080,"zone":"az1"}`
	instances := func() int {
		t.Helper()
		admin := identity.Principal{Kind: identity.KindOperator, Subject: "test", Role: identity.RoleAdmin}
		in, err := st.Registry.ListInstances(t.Context(), admin, "web", registry.InstanceFilter{IncludeEnded: true}, registry.Page{Limit: 100})
		if err != nil {
			t.Fatal(err)
		}
		return len(in)
	}

	// Refused before anything is applied: the connection is closed, no
	// answer comes, and no instance is registered.
	for _, tc := range []struct {
		name   string
		c      *http.Client
		reason string
	}{
		// The same header from a network not listed speaks for nobody.
		{"header from elsewhere", proxiedClient(netip.MustParseAddr("127.0.0.1"), from("10.9.8.7:41000")), proxied.ReasonNotAllowed},
		// The load balancer's network without a header: not proxied.
		{"no header from the load balancer", proxiedClient(lb, nil), proxied.ReasonMissing},
		{"malformed header", proxiedClient(lb, writeRaw("PROXY TCP4 10.9.8.7 10.0.0.1 41000\r\n")), proxied.ReasonMalformed},
	} {
		a := send(t, tc.c, "POST", st.URL+"/v1/services/web/instances", web, registration, nil)
		if a.err == nil {
			t.Fatalf("%s: answered %d %s, want the connection closed", tc.name, a.status, a.body)
		}
		if n := refused(t, reg, tc.reason); n != 1 {
			t.Fatalf("%s: refused{%s} = %v, want 1", tc.name, tc.reason, n)
		}
	}
	if n := instances(); n != 0 {
		t.Fatalf("%d instances registered through refused connections, want none", n)
	}
	// Without a header from 127.0.0.1 the request is served as ever, and
	// its address proves nothing about 10.9.8.7.
	a := send(t, proxiedClient(netip.MustParseAddr("127.0.0.1"), nil), "POST", st.URL+"/v1/services/web/instances", web, registration, nil)
	if a.status != http.StatusForbidden {
		t.Fatalf("registration of 10.9.8.7 from 127.0.0.1: %d %s, want 403", a.status, a.body)
	}

	// Through the load balancer, for a client at 10.9.8.7.
	at7 := proxiedClient(lb, from("10.9.8.7:41000"))
	a = send(t, at7, "POST", st.URL+"/v1/services/web/instances", web, registration, nil)
	if a.err != nil || a.status != http.StatusCreated {
		t.Fatalf("registration through the load balancer: %d %s %v, want 201", a.status, a.body, a.err)
	}
	inst := apptest.Decode[registry.Registered](t, apptest.Response{Body: []byte(a.body)})
	st.SyncNow(t)
	cred := http.Header{registry.CredentialHeader: {inst.Credential}}
	report := fmt.Sprintf(`{"reports":[{"instance_id":%q,"class":"self","outcome":"success"}]}`, inst.ID)

	// A neighbour at 10.9.8.9, through the same load balancer, with the
	// instance's credential even: not its address, not its report.
	a = send(t, proxiedClient(lb, from("10.9.8.9:41000")), "POST", st.URL+"/v1/reports", web, report, cred)
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, `"accepted":0`) || !strings.Contains(a.body, "10.9.8.9") {
		t.Fatalf("self-report from 10.9.8.9: %d %s %v, want refused naming 10.9.8.9", a.status, a.body, a.err)
	}
	a = send(t, at7, "POST", st.URL+"/v1/reports", web, report, cred)
	if a.err != nil || a.status != http.StatusOK || !strings.Contains(a.body, `"accepted":1`) {
		t.Fatalf("self-report from 10.9.8.7: %d %s %v, want accepted", a.status, a.body, a.err)
	}
	if n := instances(); n != 1 {
		t.Fatalf("%d instances, want the one registered through the load balancer", n)
	}
	// A watch stream through the load balancer: its frames are written
	// past the wrapper (proxied's WriteBuffers) and arrive whole.
	st.Hub.Publish(nil)
	req, err := http.NewRequest("GET", st.URL+"/v1/watch?service=web", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+web)
	res, err := at7.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		t.Fatalf("watch through the load balancer: %d", res.StatusCode)
	}
	frames := bufio.NewReader(res.Body)
	for range 2 {
		frame, err := frames.ReadString('\n')
		if err != nil || !strings.HasPrefix(frame, "event: ") && !strings.HasPrefix(frame, "id: ") && !strings.HasPrefix(frame, ":") {
			t.Fatalf("watch frame %q (%v)", frame, err)
		}
		for frame != "\n" && err == nil {
			frame, err = frames.ReadString('\n')
		}
	}
}
