package reconcile

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"
)

// Snapshot formats.
const (
	FormatJSON = "json"
	FormatCSV  = "csv"
)

// maxSnapshotBytes bounds a snapshot read (64 MiB: far above 60,000 rows).
const maxSnapshotBytes = 64 << 20

// SnapshotConfig configures an inventory snapshot source: a file, or an
// HTTPS URL with an optional bearer token, read in full each pass — the
// shape an EC2 Auto Scaling or ECS exporter writes.
type SnapshotConfig struct {
	// Name makes the source snapshot/<Name>.
	Name string
	// File or URL (exactly one).
	File string
	URL  string
	// Token is the bearer token for URL (never logged).
	Token string
	// Format is json or csv; by default the file's extension, else json.
	Format string
	// Client fetches URL; a 10 s timeout client when nil.
	Client *http.Client
	// Now is the clock the reading is stamped with.
	Now func() time.Time
}

// SnapshotSource reads a full inventory snapshot. Instances in it exist;
// instances no longer in it end (through the disbelief threshold). A
// snapshot that cannot be read or parsed is refused whole: nothing is
// applied and the last state stays.
type SnapshotSource struct{ cfg SnapshotConfig }

// NewSnapshotSource checks cfg and returns the source.
func NewSnapshotSource(cfg SnapshotConfig) (*SnapshotSource, error) {
	if !validName(cfg.Name) {
		return nil, fmt.Errorf("snapshot source name %q must be a DNS label", cfg.Name)
	}
	if (cfg.File == "") == (cfg.URL == "") {
		return nil, fmt.Errorf("snapshot source %s needs exactly one of file and url", cfg.Name)
	}
	if cfg.URL != "" {
		if err := checkURL(cfg.URL); err != nil {
			return nil, fmt.Errorf("snapshot source %s: %w", cfg.Name, err)
		}
	}
	if cfg.Format == "" {
		cfg.Format = FormatJSON
		if strings.HasSuffix(cfg.File, ".csv") || strings.HasSuffix(cfg.URL, ".csv") {
			cfg.Format = FormatCSV
		}
	}
	if cfg.Format != FormatJSON && cfg.Format != FormatCSV {
		return nil, fmt.Errorf("snapshot source %s: format %q must be json or csv", cfg.Name, cfg.Format)
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &SnapshotSource{cfg: cfg}, nil
}

// Name is snapshot/<name>.
func (s *SnapshotSource) Name() string { return "snapshot/" + s.cfg.Name }

// Start does nothing: a snapshot is read on each pass.
func (s *SnapshotSource) Start(context.Context) error { return nil }

// Stop does nothing.
func (s *SnapshotSource) Stop() {}

// Changed is nil: snapshots are polled.
func (s *SnapshotSource) Changed() <-chan struct{} { return nil }

// Read reads and parses the whole snapshot.
func (s *SnapshotSource) Read(ctx context.Context) (Reading, error) {
	var (
		b   []byte
		err error
	)
	if s.cfg.File != "" {
		b, err = readFileLimited(s.cfg.File)
	} else {
		b, err = s.fetch(ctx)
	}
	if err != nil {
		return Reading{}, err
	}
	var es []Endpoint
	if s.cfg.Format == FormatCSV {
		es, err = ParseSnapshotCSV(b)
	} else {
		es, err = ParseSnapshotJSON(b)
	}
	if err != nil {
		return Reading{}, fmt.Errorf("snapshot refused, last state kept: %w", err)
	}
	return Reading{Endpoints: es, At: s.cfg.Now()}, nil
}

func readFileLimited(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open snapshot: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxSnapshotBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read snapshot: %w", err)
	}
	if len(b) > maxSnapshotBytes {
		return nil, fmt.Errorf("snapshot larger than %d bytes", maxSnapshotBytes)
	}
	return b, nil
}

func (s *SnapshotSource) fetch(ctx context.Context) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, s.cfg.URL, nil)
	if err != nil {
		return nil, fmt.Errorf("snapshot request: %w", err)
	}
	if s.cfg.Token != "" {
		req.Header.Set("Authorization", "Bearer "+s.cfg.Token)
	}
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("fetch snapshot: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("fetch snapshot: %s", resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, maxSnapshotBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read snapshot body: %w", err)
	}
	if len(b) > maxSnapshotBytes {
		return nil, fmt.Errorf("snapshot larger than %d bytes", maxSnapshotBytes)
	}
	if resp.ContentLength >= 0 && int64(len(b)) != resp.ContentLength {
		return nil, fmt.Errorf("snapshot truncated: %d of %d bytes", len(b), resp.ContentLength)
	}
	return b, nil
}

// checkURL accepts https, or http on a loopback host (a local exporter; the
// tests' httptest server): a bearer token over plain http elsewhere would
// travel in the clear.
func checkURL(raw string) error {
	switch {
	case strings.HasPrefix(raw, "https://"):
		return nil
	case strings.HasPrefix(raw, "http://127.0.0.1"), strings.HasPrefix(raw, "http://localhost"), strings.HasPrefix(raw, "http://[::1]"):
		return nil
	}
	return fmt.Errorf("url %q must be https (or http on a loopback host)", raw)
}

// snapshotJSON is the JSON snapshot: every instance of the fleet.
type snapshotJSON struct {
	Instances []snapshotRow `json:"instances"`
}

type snapshotRow struct {
	// ID is the inventory's instance id (an EC2 instance id, an ECS task
	// ARN): with the service it derives the muster instance id, so it must
	// never be reused for another machine.
	ID      string `json:"id"`
	Service string `json:"service"`
	Address string `json:"address"`
	Port    int    `json:"port"`
	Zone    string `json:"zone"`
	// Ready defaults to true; false is an instance the inventory has that
	// is not in service yet (Auto Scaling's Pending).
	Ready *bool `json:"ready,omitempty"`
}

// ParseSnapshotJSON parses a JSON snapshot: {"instances":[{"id","service",
// "address","port","zone","ready"}]}. Unknown fields, trailing data and
// any invalid row refuse the whole snapshot.
func ParseSnapshotJSON(b []byte) ([]Endpoint, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	var s snapshotJSON
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("parse JSON snapshot: %w", err)
	}
	if dec.More() {
		return nil, errors.New("parse JSON snapshot: data after the snapshot")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("parse JSON snapshot: data after the snapshot")
	}
	if s.Instances == nil {
		return nil, errors.New(`parse JSON snapshot: no "instances" list (an empty fleet is "instances": [])`)
	}
	return rowsToEndpoints(s.Instances)
}

// ParseSnapshotCSV parses a CSV snapshot with the header
// id,service,address,port,zone[,ready].
func ParseSnapshotCSV(b []byte) ([]Endpoint, error) {
	r := csv.NewReader(bytes.NewReader(b))
	recs, err := r.ReadAll()
	if err != nil {
		return nil, fmt.Errorf("parse CSV snapshot: %w", err)
	}
	if len(recs) == 0 {
		return nil, errors.New("parse CSV snapshot: no header")
	}
	head := strings.Join(recs[0], ",")
	withReady := head == "id,service,address,port,zone,ready"
	if !withReady && head != "id,service,address,port,zone" {
		return nil, fmt.Errorf("parse CSV snapshot: header %q, want id,service,address,port,zone[,ready]", head)
	}
	rows := make([]snapshotRow, 0, len(recs)-1)
	for i, rec := range recs[1:] {
		port, err := strconv.Atoi(rec[3])
		if err != nil {
			return nil, fmt.Errorf("parse CSV snapshot: line %d: port %q is not a number", i+2, rec[3])
		}
		row := snapshotRow{ID: rec[0], Service: rec[1], Address: rec[2], Port: port, Zone: rec[4]}
		if withReady {
			v, err := strconv.ParseBool(rec[5])
			if err != nil {
				return nil, fmt.Errorf("parse CSV snapshot: line %d: ready %q is not true or false", i+2, rec[5])
			}
			row.Ready = &v
		}
		rows = append(rows, row)
	}
	return rowsToEndpoints(rows)
}

func rowsToEndpoints(rows []snapshotRow) ([]Endpoint, error) {
	out := make([]Endpoint, 0, len(rows))
	ids := map[string]bool{}
	for i, r := range rows {
		where := fmt.Sprintf("instance %d", i)
		if r.ID == "" || len(r.ID) > 256 {
			return nil, fmt.Errorf("%s: id must be 1 to 256 characters", where)
		}
		where = fmt.Sprintf("instance %d (%s)", i, r.ID)
		if !validName(r.Service) {
			return nil, fmt.Errorf("%s: service %q is not a service name", where, r.Service)
		}
		if ids[r.Service+"\x00"+r.ID] {
			return nil, fmt.Errorf("%s: id listed twice for %s", where, r.Service)
		}
		ids[r.Service+"\x00"+r.ID] = true
		a, err := netip.ParseAddr(r.Address)
		if err != nil || a.Zone() != "" || a.IsUnspecified() || a.IsMulticast() {
			return nil, fmt.Errorf("%s: address %q is not a unicast IP address", where, r.Address)
		}
		if r.Port < 1 || r.Port > 65535 {
			return nil, fmt.Errorf("%s: port %d is not between 1 and 65535", where, r.Port)
		}
		if !validName(r.Zone) {
			return nil, fmt.Errorf("%s: zone %q is not a DNS label", where, r.Zone)
		}
		ready := r.Ready == nil || *r.Ready
		out = append(out, Endpoint{Service: r.Service, Key: r.ID, Address: a.Unmap().String(), Port: r.Port, Zone: r.Zone,
			Ready: ready, Serving: ready, Vouched: true})
	}
	return out, nil
}

// validName is a lowercase DNS label (services, zones, source names).
func validName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z':
		case (c >= '0' && c <= '9') || c == '-':
			if i == 0 && c == '-' {
				return false
			}
		default:
			return false
		}
	}
	return s[len(s)-1] != '-'
}
