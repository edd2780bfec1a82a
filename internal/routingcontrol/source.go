package routingcontrol

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// Reading is what a Source read.
type Reading struct {
	// Regions are the controls the source names; a region it does not
	// name is On.
	Regions map[string]State
	// Revision is the source's own revision of what it holds (an HTTP
	// ETag, a digest of the file or the TXT strings), for logs and the
	// API, and for the next Read's If-None-Match.
	Revision string
	// NotModified: the source said nothing changed since the revision
	// Read was given (HTTP 304); Regions is nil.
	NotModified bool
}

// Source is where the routing controls are read from. Read must return
// within ctx's deadline.
type Source interface {
	// Kind is "file", "https" or "dns".
	Kind() string
	// Location says where, for logs and the API (no credentials).
	Location() string
	// Read reads the controls; last is the revision of the last good
	// reading ("" for none).
	Read(ctx context.Context, last string) (Reading, error)
}

// Reasons a read fails, the label of muster_routing_control_read_failures_total.
const (
	ReasonUnreachable = "unreachable"
	ReasonTimeout     = "timeout"
	ReasonMalformed   = "malformed"
	ReasonStatus      = "status"
	ReasonTooLarge    = "too_large"
	ReasonMissing     = "missing"
)

// ReadError is a failed read, with its reason.
type ReadError struct {
	Reason string
	Err    error
}

func (e *ReadError) Error() string { return e.Reason + ": " + e.Err.Error() }
func (e *ReadError) Unwrap() error { return e.Err }

// failure classifies err as a ReadError.
func failure(ctx context.Context, err error) error {
	var re *ReadError
	switch {
	case errors.As(err, &re):
		return err
	case errors.Is(err, ErrMalformed):
		return &ReadError{Reason: ReasonMalformed, Err: err}
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(ctx.Err(), context.DeadlineExceeded):
		return &ReadError{Reason: ReasonTimeout, Err: err}
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return &ReadError{Reason: ReasonTimeout, Err: err}
	}
	return &ReadError{Reason: ReasonUnreachable, Err: err}
}

// ReasonOf returns err's reason (ReasonUnreachable for an unclassified
// error).
func ReasonOf(err error) string {
	var re *ReadError
	if errors.As(err, &re) {
		return re.Reason
	}
	return ReasonUnreachable
}

func digest(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// FileSource reads a JSON document from a file, or a YAML one when its
// name ends in .yaml or .yml. The file is opened afresh on every read, so
// a file replaced by an atomic rename is picked up at the next read.
type FileSource struct {
	Path string
}

// Kind is "file".
func (s *FileSource) Kind() string { return "file" }

// Location is the file's path.
func (s *FileSource) Location() string { return s.Path }

// Read reads and parses the file.
func (s *FileSource) Read(ctx context.Context, _ string) (Reading, error) {
	f, err := os.Open(s.Path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return Reading{}, &ReadError{Reason: ReasonMissing, Err: err}
		}
		return Reading{}, &ReadError{Reason: ReasonUnreachable, Err: err}
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, MaxDocumentBytes+1))
	if err != nil {
		return Reading{}, failure(ctx, fmt.Errorf("read %s: %w", s.Path, err))
	}
	if len(data) > MaxDocumentBytes {
		return Reading{}, &ReadError{Reason: ReasonTooLarge, Err: fmt.Errorf("%s is larger than %d bytes", s.Path, MaxDocumentBytes)}
	}
	parse := ParseDocument
	if ext := strings.ToLower(filepath.Ext(s.Path)); ext == ".yaml" || ext == ".yml" {
		parse = ParseYAMLDocument
	}
	regions, err := parse(data)
	if err != nil {
		return Reading{}, &ReadError{Reason: ReasonMalformed, Err: fmt.Errorf("%s: %w", s.Path, err)}
	}
	return Reading{Regions: regions, Revision: digest(data)}, nil
}

// HTTPSource reads a JSON document with GET from an https URL, sending
// the last reading's ETag as If-None-Match.
type HTTPSource struct {
	URL string
	// Client makes the request; NewHTTPSource builds one.
	Client *http.Client
}

// NewHTTPSource returns a source reading rawURL (https only), trusting the
// CA bundle in caFile when set (the system's roots otherwise), each
// request bounded by timeout.
func NewHTTPSource(rawURL, caFile string, timeout time.Duration) (*HTTPSource, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("routing control URL %q: %w", rawURL, err)
	}
	if u.Scheme != "https" || u.Host == "" {
		return nil, fmt.Errorf("routing control URL %q: want https://HOST/PATH (the signal must not travel in clear)", rawURL)
	}
	if u.User != nil {
		return nil, fmt.Errorf("routing control URL %q: credentials in the URL are not supported", u.Redacted())
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("routing control CA bundle: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("routing control CA bundle %s: no PEM certificate in it", caFile)
		}
		tc.RootCAs = pool
	}
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	t := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: timeout}).DialContext,
		TLSClientConfig:       tc,
		TLSHandshakeTimeout:   timeout,
		ResponseHeaderTimeout: timeout,
		MaxIdleConnsPerHost:   1,
		ForceAttemptHTTP2:     true,
	}
	client := &http.Client{Transport: t, Timeout: timeout, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		// A redirect may not downgrade the signal to clear text.
		if req.URL.Scheme != "https" {
			return fmt.Errorf("redirected to %s: only https is followed", req.URL.Redacted())
		}
		if len(via) >= 5 {
			return errors.New("more than 5 redirects")
		}
		return nil
	}}
	return &HTTPSource{URL: rawURL, Client: client}, nil
}

// Kind is "https".
func (s *HTTPSource) Kind() string { return "https" }

// Location is the URL.
func (s *HTTPSource) Location() string { return s.URL }

// Read GETs the document; a 304 to If-None-Match is NotModified, any other
// status but 200 an error.
func (s *HTTPSource) Read(ctx context.Context, last string) (Reading, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.URL, nil)
	if err != nil {
		return Reading{}, &ReadError{Reason: ReasonUnreachable, Err: err}
	}
	req.Header.Set("Accept", "application/json")
	if last != "" && !strings.HasPrefix(last, "sha256:") {
		req.Header.Set("If-None-Match", last)
	}
	resp, err := s.Client.Do(req)
	if err != nil {
		return Reading{}, failure(ctx, fmt.Errorf("GET %s: %w", s.URL, err))
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusOK:
	case http.StatusNotModified:
		return Reading{Revision: last, NotModified: true}, nil
	default:
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return Reading{}, &ReadError{Reason: ReasonStatus, Err: fmt.Errorf("GET %s: %s", s.URL, resp.Status)}
	}
	data, err := io.ReadAll(io.LimitReader(resp.Body, MaxDocumentBytes+1))
	if err != nil {
		return Reading{}, failure(ctx, fmt.Errorf("GET %s: read the body: %w", s.URL, err))
	}
	if len(data) > MaxDocumentBytes {
		return Reading{}, &ReadError{Reason: ReasonTooLarge, Err: fmt.Errorf("GET %s: the body is larger than %d bytes", s.URL, MaxDocumentBytes)}
	}
	regions, err := ParseDocument(data)
	if err != nil {
		if ctx.Err() != nil {
			// The read outlived its deadline: whatever came back is
			// what a timeout left, not the source's document.
			return Reading{}, &ReadError{Reason: ReasonTimeout, Err: fmt.Errorf("GET %s: %w (past the read's deadline)", s.URL, err)}
		}
		return Reading{}, &ReadError{Reason: ReasonMalformed, Err: fmt.Errorf("GET %s: %w", s.URL, err)}
	}
	rev := resp.Header.Get("ETag")
	if rev == "" {
		rev = digest(data)
	}
	return Reading{Regions: regions, Revision: rev}, nil
}

// DNSSource reads the TXT record set of Name (ParseTXT) from Server, a
// resolver's host:port, or from the system's resolvers
// (/etc/resolv.conf) when Server is empty. A truncated UDP answer is
// asked again over TCP.
type DNSSource struct {
	Name   string
	Server string
}

// Kind is "dns".
func (s *DNSSource) Kind() string { return "dns" }

// Location is NAME@SERVER, or NAME for the system's resolvers.
func (s *DNSSource) Location() string {
	if s.Server == "" {
		return s.Name
	}
	return s.Name + "@" + s.Server
}

// Read queries the TXT records.
func (s *DNSSource) Read(ctx context.Context, _ string) (Reading, error) {
	servers := []string{s.Server}
	if s.Server == "" {
		cc, err := dns.ClientConfigFromFile("/etc/resolv.conf")
		if err != nil {
			return Reading{}, &ReadError{Reason: ReasonUnreachable, Err: fmt.Errorf("system resolvers: %w", err)}
		}
		servers = servers[:0]
		for _, h := range cc.Servers {
			servers = append(servers, net.JoinHostPort(h, cc.Port))
		}
		if len(servers) == 0 {
			return Reading{}, &ReadError{Reason: ReasonUnreachable, Err: errors.New("no resolver in /etc/resolv.conf")}
		}
	}
	q := new(dns.Msg)
	q.SetQuestion(dns.Fqdn(s.Name), dns.TypeTXT)
	q.RecursionDesired = true
	var lastErr error
	for _, server := range servers {
		in, err := s.exchange(ctx, q, server)
		if err != nil {
			lastErr = failure(ctx, fmt.Errorf("TXT %s @%s: %w", s.Name, server, err))
			continue
		}
		switch in.Rcode {
		case dns.RcodeSuccess:
		case dns.RcodeNameError:
			return Reading{}, &ReadError{Reason: ReasonMissing, Err: fmt.Errorf("TXT %s @%s: no such name (NXDOMAIN)", s.Name, server)}
		default:
			lastErr = &ReadError{Reason: ReasonStatus, Err: fmt.Errorf("TXT %s @%s: %s", s.Name, server, dns.RcodeToString[in.Rcode])}
			continue
		}
		var strs []string
		for _, rr := range in.Answer {
			if txt, ok := rr.(*dns.TXT); ok && strings.EqualFold(txt.Hdr.Name, dns.Fqdn(s.Name)) {
				strs = append(strs, txt.Txt...)
			}
		}
		if len(strs) == 0 {
			return Reading{}, &ReadError{Reason: ReasonMissing, Err: fmt.Errorf("TXT %s @%s: no TXT record", s.Name, server)}
		}
		regions, err := ParseTXT(strs)
		if err != nil {
			return Reading{}, &ReadError{Reason: ReasonMalformed, Err: fmt.Errorf("TXT %s @%s: %w", s.Name, server, err)}
		}
		sorted := slices.Clone(strs)
		slices.Sort(sorted)
		return Reading{Regions: regions, Revision: digest([]byte(strings.Join(sorted, "\x00")))}, nil
	}
	return Reading{}, lastErr
}

func (s *DNSSource) exchange(ctx context.Context, q *dns.Msg, server string) (*dns.Msg, error) {
	c := &dns.Client{Net: "udp"}
	in, _, err := c.ExchangeContext(ctx, q, server)
	if err == nil && in.Truncated {
		c.Net = "tcp"
		in, _, err = c.ExchangeContext(ctx, q, server)
	}
	return in, err
}

// ParseSource reads a --routing-control value: file:/PATH, https://…
// (caFile its CA bundle), dns:NAME@HOST:PORT or dns:NAME (the system's
// resolvers). timeout bounds an HTTPS request.
func ParseSource(spec, caFile string, timeout time.Duration) (Source, error) {
	switch {
	case strings.HasPrefix(spec, "file:"):
		p := strings.TrimPrefix(spec, "file:")
		if p == "" {
			return nil, fmt.Errorf("routing control %q: want file:/PATH", spec)
		}
		if caFile != "" {
			return nil, errors.New("--routing-control-ca is for an https:// routing control")
		}
		return &FileSource{Path: p}, nil
	case strings.HasPrefix(spec, "https://"), strings.HasPrefix(spec, "http://"):
		return NewHTTPSource(spec, caFile, timeout)
	case strings.HasPrefix(spec, "dns:"):
		if caFile != "" {
			return nil, errors.New("--routing-control-ca is for an https:// routing control")
		}
		name, server, _ := strings.Cut(strings.TrimPrefix(spec, "dns:"), "@")
		if _, ok := dns.IsDomainName(name); !ok || name == "" || strings.Trim(name, ".") == "" {
			return nil, fmt.Errorf("routing control %q: %q is not a DNS name (want dns:NAME@HOST:PORT or dns:NAME)", spec, name)
		}
		if server != "" {
			host, port, err := net.SplitHostPort(server)
			if err != nil || host == "" || port == "" {
				return nil, fmt.Errorf("routing control %q: the resolver %q is not HOST:PORT", spec, server)
			}
		}
		return &DNSSource{Name: name, Server: server}, nil
	}
	return nil, fmt.Errorf("routing control %q: want file:/PATH, https://HOST/PATH or dns:NAME[@HOST:PORT]", spec)
}
