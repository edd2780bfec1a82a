package server

import (
	"context"
	"encoding/json"
	"io/fs"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/go-chi/chi/v5"
	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/musterhq/muster/internal/assembler"
	"github.com/musterhq/muster/internal/audit"
	"github.com/musterhq/muster/internal/disbelief"
	"github.com/musterhq/muster/internal/evaluator"
	"github.com/musterhq/muster/internal/federation"
	"github.com/musterhq/muster/internal/forward"
	"github.com/musterhq/muster/internal/ownership"
	"github.com/musterhq/muster/internal/policy"
	"github.com/musterhq/muster/internal/preview"
	"github.com/musterhq/muster/internal/registry"
	"github.com/musterhq/muster/internal/relay"
	"github.com/musterhq/muster/internal/shift"
	"github.com/musterhq/muster/openapi"
)

// These tests keep openapi/openapi.yaml and the router in step. They need
// no database: the router is built from a Server with only what routes()
// touches while registering handlers.

// specRoute is one method and path the router serves.
type specRoute struct {
	method, path string
	// authenticated: the route runs behind Server.authenticate.
	authenticated bool
	// peer: the route runs behind Server.authenticatePeer (replicas of
	// the region only, by their signature).
	peer bool
}

func (r specRoute) key() string { return r.method + " " + r.path }

// chiParam matches a chi path parameter, with an optional regexp, so that
// "{id:[0-9]+}" compares equal to the OpenAPI template "{id}".
var chiParam = regexp.MustCompile(`\{([^}:]+)(?::[^}]*)?\}`)

// routerRoutes walks the router and returns its routes by "METHOD /path".
func routerRoutes(t *testing.T) map[string]specRoute {
	t.Helper()
	s := &Server{cfg: Config{Metrics: prometheus.NewRegistry()}}
	r := s.routes()
	authPC := reflect.ValueOf(s.authenticate).Pointer()
	peerPC := reflect.ValueOf(s.authenticatePeer).Pointer()

	out := map[string]specRoute{}
	err := chi.Walk(r, func(method, path string, _ http.Handler, mws ...func(http.Handler) http.Handler) error {
		// The dev issuer is mounted only by `muster dev` and is deliberately
		// not part of the API description.
		if p := s.cfg.DevIssuerPath; p != "" && (path == p || strings.HasPrefix(path, p+"/")) {
			return nil
		}
		// chi.Walk leaves "/*" on the end of a path whose subtree it cannot
		// walk into; nothing of the API is mounted that way.
		if strings.HasSuffix(path, "/*") {
			t.Errorf("route %s %s is a mounted subtree the spec cannot describe; mount a chi router instead", method, path)
			return nil
		}
		sr := specRoute{method: method, path: chiParam.ReplaceAllString(path, "{$1}")}
		for _, mw := range mws {
			switch reflect.ValueOf(mw).Pointer() {
			case authPC:
				sr.authenticated = true
			case peerPC:
				sr.peer = true
			}
		}
		out[sr.key()] = sr
		return nil
	})
	if err != nil {
		t.Fatalf("walk router: %v", err)
	}
	if len(out) == 0 {
		t.Fatal("the router has no routes")
	}
	return out
}

// loadSpec loads and validates the embedded OpenAPI description.
func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromData(openapi.Spec)
	if err != nil {
		t.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("openapi.yaml is not a valid OpenAPI %s document: %v", doc.OpenAPI, err)
	}
	return doc
}

// specOp is one operation of the spec.
type specOp struct {
	method, path string
	op           *openapi3.Operation
}

func specOps(doc *openapi3.T) map[string]specOp {
	out := map[string]specOp{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			out[method+" "+path] = specOp{method: method, path: path, op: op}
		}
	}
	return out
}

// TestSpecMatchesRoutes checks that every route the router serves is an
// operation of openapi.yaml and every operation is a route.
func TestSpecMatchesRoutes(t *testing.T) {
	doc := loadSpec(t)
	routes := routerRoutes(t)
	ops := specOps(doc)

	var undocumented, phantom []string
	for k := range routes {
		if _, ok := ops[k]; !ok {
			undocumented = append(undocumented, k)
		}
	}
	for k := range ops {
		if _, ok := routes[k]; !ok {
			phantom = append(phantom, k)
		}
	}
	slices.Sort(undocumented)
	slices.Sort(phantom)
	for _, k := range undocumented {
		t.Errorf("route %s is not in openapi.yaml", k)
	}
	for _, k := range phantom {
		t.Errorf("openapi.yaml describes %s, which the router does not serve", k)
	}
	t.Logf("%d routes, %d operations (OpenAPI %s)", len(routes), len(ops), doc.OpenAPI)
}

func hasStatus(op *openapi3.Operation, code string) bool {
	return op.Responses != nil && op.Responses.Value(code) != nil
}

// effectiveSecurity is the operation's security, or the document's when the
// operation says nothing.
func effectiveSecurity(doc *openapi3.T, op *openapi3.Operation) openapi3.SecurityRequirements {
	if op.Security != nil {
		return *op.Security
	}
	return doc.Security
}

func requiresBearer(reqs openapi3.SecurityRequirements) bool {
	if len(reqs) == 0 {
		return false
	}
	for _, req := range reqs {
		// Every alternative must include the bearer token: an empty
		// requirement ({}) would make authentication optional.
		if _, ok := req["bearerAuth"]; !ok {
			return false
		}
	}
	return true
}

// TestSpecRouteResponses checks that the responses each operation declares
// cover what the middleware and decoders around its handler can produce.
func TestSpecRouteResponses(t *testing.T) {
	doc := loadSpec(t)
	routes := routerRoutes(t)
	ops := specOps(doc)

	keys := make([]string, 0, len(ops))
	for k := range ops {
		keys = append(keys, k)
	}
	slices.Sort(keys)

	for _, k := range keys {
		o := ops[k]
		op := o.op
		rt, routed := routes[k]
		peerOnly := routed && rt.peer
		authenticated := (strings.HasPrefix(o.path, "/v1/") && !peerOnly) || (routed && rt.authenticated)
		if routed && strings.HasPrefix(o.path, "/v1/") && !rt.authenticated && !rt.peer {
			t.Errorf("%s: the router serves it without authenticate", k)
		}
		if peerOnly && rt.authenticated {
			t.Errorf("%s: runs behind both authenticate and authenticatePeer", k)
		}

		if peerOnly {
			// authenticatePeer answers 401 for a missing or refused
			// signature and 429 to an address with too many of those.
			for _, code := range []string{"401", "429", "500", "503"} {
				if !hasStatus(op, code) {
					t.Errorf("%s: runs behind authenticatePeer but declares no %s response", k, code)
				}
			}
			reqs := effectiveSecurity(doc, op)
			if len(reqs) != 1 || len(reqs[0]) != 1 || reqs[0]["peerSignature"] == nil {
				t.Errorf("%s: runs behind authenticatePeer but does not require peerSignature alone", k)
			}
		} else if authenticated {
			// authenticate answers 401 for a missing or refused token, 429
			// to an address with too many of those, and 503 when the
			// issuer cannot be reached; any handler behind it can fail
			// with 500.
			for _, code := range []string{"401", "429", "500", "503"} {
				if !hasStatus(op, code) {
					t.Errorf("%s: runs behind authenticate but declares no %s response", k, code)
				}
			}
			if !requiresBearer(effectiveSecurity(doc, op)) {
				t.Errorf("%s: runs behind authenticate but does not require bearerAuth", k)
			}
		} else if len(effectiveSecurity(doc, op)) > 0 {
			t.Errorf("%s: is served without authentication but declares security", k)
		}

		if op.RequestBody != nil {
			// decodeJSON: 415 wrong content type, 413 too large, 400
			// malformed JSON or unknown field; the domain validates: 422.
			for _, code := range []string{"400", "413", "415", "422"} {
				if !hasStatus(op, code) {
					t.Errorf("%s: has a request body but declares no %s response", k, code)
				}
			}
			rb := op.RequestBody.Value
			if rb == nil || len(rb.Content) != 1 || rb.Content.Get("application/json") == nil {
				t.Errorf("%s: the request body must be application/json only, as decodeJSON accepts nothing else", k)
			}
			// An optional body is for DELETE only (the justification of
			// a deregistration): no body there is an empty request.
			if rb != nil && !rb.Required && o.method != http.MethodDelete {
				t.Errorf("%s: the request body must be required; only a DELETE may take an optional one", k)
			}
		}
		for _, p := range op.Parameters {
			if p.Value != nil && p.Value.In == openapi3.ParameterInQuery &&
				(p.Value.Name == "limit" || p.Value.Name == "cursor") && !hasStatus(op, "400") {
				t.Errorf("%s: takes ?%s= but declares no 400 response for a bad value", k, p.Value.Name)
			}
		}

		for code, ref := range op.Responses.Map() {
			resp := ref.Value
			if resp == nil {
				t.Errorf("%s %s: unresolved response", k, code)
				continue
			}
			if code == "default" || code[0] < '4' {
				continue
			}
			mt := resp.Content.Get("application/problem+json")
			if len(resp.Content) != 1 || mt == nil || mt.Schema == nil || !strings.HasSuffix(mt.Schema.Ref, "/schemas/Problem") {
				t.Errorf("%s %s: error responses must be application/problem+json with the Problem schema", k, code)
			}
			if resp.Description == nil || !strings.Contains(*resp.Description, "https://muster.dev/problems/") {
				t.Errorf("%s %s: the description does not name the problem type", k, code)
			}
			switch code {
			case "503":
				if resp.Headers["Retry-After"] == nil {
					t.Errorf("%s 503: writeProblem sends Retry-After, the spec does not declare it", k)
				}
			case "401":
				if resp.Headers["WWW-Authenticate"] == nil {
					t.Errorf("%s 401: writeProblem sends WWW-Authenticate, the spec does not declare it", k)
				}
			}
		}
	}
}

// problemCall matches problem(http.StatusX, "slug", …) in the server's
// source.
var problemCall = regexp.MustCompile(`problem\(\s*http\.Status\w+,\s*"([a-z0-9-]+)"`)

// subKind matches kind.Sub("name", "slug") and broadKind the broad kinds'
// literals in refusal/.
var (
	subKind   = regexp.MustCompile(`\.Sub\(\s*"[^"]*",\s*"([a-z0-9-]+)"\)`)
	broadKind = regexp.MustCompile(`problem:\s*"([a-z0-9-]+)"`)
)

// TestSpecProblemTypes checks that every problem type the server can send
// is documented and that the spec documents no other.
func TestSpecProblemTypes(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	inCode := map[string]bool{}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range problemCall.FindAllStringSubmatch(string(src), -1) {
			inCode[m[1]] = true
		}
	}
	if len(inCode) == 0 {
		t.Fatal("found no problem(...) calls in the server's source; has the helper been renamed?")
	}
	// Refusals (registry's, policy's, the shift-backs') are sent with
	// their kind's problem type: the broad kinds in refusal/, and every
	// narrower kind made with Sub anywhere in the module.
	kinds := 0
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return err
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		re := subKind
		if filepath.Base(filepath.Dir(path)) == "refusal" {
			re = broadKind
		}
		for _, m := range re.FindAllStringSubmatch(string(src), -1) {
			inCode[m[1]] = true
			kinds++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if kinds == 0 {
		t.Fatal("found no refusal kinds in the module's source; has refusal.Kind changed?")
	}

	inSpec := map[string]bool{}
	typeRE := regexp.MustCompile(regexp.QuoteMeta(ProblemBase) + `([a-z0-9-]+)`)
	for _, m := range typeRE.FindAllStringSubmatch(string(openapi.Spec), -1) {
		inSpec[m[1]] = true
	}
	// The slug table in info.description names each type by slug alone.
	for _, m := range regexp.MustCompile("(?m)^\\s*\\| `([a-z0-9-]+)` \\|").FindAllStringSubmatch(loadSpec(t).Info.Description, -1) {
		inSpec[m[1]] = true
	}

	for _, slug := range slices.Sorted(maps.Keys(inCode)) {
		if !inSpec[slug] {
			t.Errorf("the server sends problem type %s%s, which openapi.yaml does not document", ProblemBase, slug)
		}
	}
	for _, slug := range slices.Sorted(maps.Keys(inSpec)) {
		if !inCode[slug] {
			t.Errorf("openapi.yaml documents problem type %s%s, which the server never sends", ProblemBase, slug)
		}
	}
}

// jsonFields returns the JSON names of t's fields and which of them are
// always encoded (no omitempty or omitzero).
func jsonFields(t reflect.Type) (names []string, always []string) {
	for f := range t.Fields() {
		if f.Anonymous && f.Type.Kind() == reflect.Struct && f.Tag.Get("json") == "" {
			// encoding/json encodes an embedded struct's fields as its own.
			n, a := jsonFields(f.Type)
			names, always = append(names, n...), append(always, a...)
			continue
		}
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			name = f.Name
		}
		names = append(names, name)
		if !strings.Contains(","+opts+",", ",omitempty,") && !strings.Contains(","+opts+",", ",omitzero,") {
			always = append(always, name)
		}
	}
	slices.Sort(names)
	slices.Sort(always)
	return names, always
}

// TestSpecSchemasMatchTypes checks the component schemas against the Go
// types the handlers decode and encode: the same properties, "required"
// exactly where a response field is always encoded, defaults and limits as
// in the registry, and real encoded values valid against their schemas.
func TestSpecSchemasMatchTypes(t *testing.T) {
	doc := loadSpec(t)
	schema := func(name string) *openapi3.Schema {
		t.Helper()
		ref := doc.Components.Schemas[name]
		if ref == nil || ref.Value == nil {
			t.Fatalf("openapi.yaml has no schema %s", name)
		}
		return ref.Value
	}

	for _, tt := range []struct {
		schema   string
		typ      reflect.Type
		response bool // encoded by the server: "required" must match
	}{
		{"ServiceSpec", reflect.TypeFor[registry.ServiceSpec](), false},
		{"Contract", reflect.TypeFor[registry.Contract](), false},
		{"Dependency", reflect.TypeFor[registry.Dependency](), false},
		{"Registration", reflect.TypeFor[registry.Registration](), false},
		{"Service", reflect.TypeFor[registry.Service](), true},
		{"StoredContract", reflect.TypeFor[registry.StoredContract](), true},
		{"Instance", reflect.TypeFor[registry.Instance](), true},
		{"AuditEvent", reflect.TypeFor[audit.Event](), true},
		{"ProberAssignments", reflect.TypeFor[registry.ProberAssignments](), false},
		{"ReportBatch", reflect.TypeFor[reportBatch](), false},
		{"PeerReports", reflect.TypeFor[forward.Body](), false},
		{"PeerBatch", reflect.TypeFor[forward.Batch](), false},
		{"PeerActor", reflect.TypeFor[forward.Actor](), false},
		{"PeerReportResult", reflect.TypeFor[forward.Result](), true},
		{"GrantsBody", reflect.TypeFor[grantsBody](), false},
		{"AlarmList", reflect.TypeFor[alarmList](), true},
		{"Alarm", reflect.TypeFor[assembler.Alarm](), true},
		{"Grants", reflect.TypeFor[registry.Grants](), true},
		{"Report", reflect.TypeFor[evaluator.Report](), false},
		{"ReportResult", reflect.TypeFor[evaluator.Result](), true},
		{"ReportRefusal", reflect.TypeFor[evaluator.Refusal](), true},
		{"ServiceEligibility", reflect.TypeFor[evaluator.ServiceEligibility](), true},
		{"InstanceVerdict", reflect.TypeFor[evaluator.InstanceVerdict](), true},
		{"ClassEvidence", reflect.TypeFor[evaluator.ClassEvidence](), true},
		{"Problem", reflect.TypeFor[Problem](), true},
		{"FieldError", reflect.TypeFor[registry.FieldError](), true},
		{"ServiceList", reflect.TypeFor[list[registry.Service]](), true},
		{"InstanceList", reflect.TypeFor[list[registry.Instance]](), true},
		{"AuditEventList", reflect.TypeFor[list[audit.Event]](), true},
		{"ShiftRequest", reflect.TypeFor[shift.Request](), false},
		{"Shift", reflect.TypeFor[shift.Shift](), true},
		{"ShiftList", reflect.TypeFor[list[shift.Shift]](), true},
		{"OverrideRequest", reflect.TypeFor[policy.Request](), false},
		{"CosignRequest", reflect.TypeFor[policy.CosignRequest](), false},
		{"DeregisterRequest", reflect.TypeFor[policy.DeregisterRequest](), false},
		{"Override", reflect.TypeFor[policy.Override](), true},
		{"OverrideList", reflect.TypeFor[list[policy.Override]](), true},
		{"OverrideMark", reflect.TypeFor[evaluator.Override](), true},
		{"LeaseExpiryStatus", reflect.TypeFor[leaseExpiryStatus](), true},
		{"RemovalHold", reflect.TypeFor[disbelief.Hold](), true},
		{"RegionOwnership", reflect.TypeFor[replicasBody](), true},
		{"RelayPeer", reflect.TypeFor[relay.PeerStatus](), true},
		{"PeerRegions", reflect.TypeFor[regionsBody](), true},
		{"PeerRegion", reflect.TypeFor[federation.PeerStatus](), true},
		{"RemoteView", reflect.TypeFor[remoteViewBody](), true},
		{"ReplicaOwnership", reflect.TypeFor[ownership.ReplicaStatus](), true},
		{"ShardTenure", reflect.TypeFor[ownership.ShardStatus](), true},
		{"RemovalScope", reflect.TypeFor[disbelief.Scope](), true},
		{"RemovalHolds", reflect.TypeFor[removalHolds](), true},
		{"RemovalConfirmationRequest", reflect.TypeFor[removalConfirmation](), false},
		{"LeaseConfirmationRequest", reflect.TypeFor[leaseConfirmation](), false},
		{"LeaseConfirmation", reflect.TypeFor[registry.Confirmation](), true},
		{"ReconcileConfirmation", reflect.TypeFor[registry.ReconcileConfirmation](), true},
		{"RenewalBatch", reflect.TypeFor[renewalBatch](), false},
		{"RenewalItem", reflect.TypeFor[renewalItem](), false},
		{"RenewalResults", reflect.TypeFor[renewalResults](), true},
		{"RenewalResult", reflect.TypeFor[registry.RenewalResult](), true},
		{"PeerRecord", reflect.TypeFor[relay.Record](), true},
		{"ContractPreview", reflect.TypeFor[preview.Result](), true},
		{"PreviewOutcome", reflect.TypeFor[preview.Outcome](), true},
		{"PreviewCounts", reflect.TypeFor[preview.Counts](), true},
		{"PreviewPoint", reflect.TypeFor[preview.Point](), true},
		{"PreviewGuard", reflect.TypeFor[preview.Guard](), true},
		{"PreviewVerdict", reflect.TypeFor[preview.Verdict](), true},
		{"PreviewDifference", reflect.TypeFor[preview.Difference](), true},
	} {
		s := schema(tt.schema)
		names, always := jsonFields(tt.typ)
		props := slices.Sorted(maps.Keys(s.Properties))
		if !slices.Equal(names, props) {
			t.Errorf("schema %s has properties %v; %s encodes %v", tt.schema, props, tt.typ, names)
		}
		if tt.response {
			if req := slices.Sorted(slices.Values(s.Required)); !slices.Equal(req, always) {
				t.Errorf("schema %s requires %v; %s always encodes %v", tt.schema, req, tt.typ, always)
			}
		}
	}

	// Platform defaults and limits.
	var defaults map[string]any
	raw, err := json.Marshal(registry.DefaultContract())
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &defaults); err != nil {
		t.Fatal(err)
	}
	for name, p := range schema("Contract").Properties {
		want := defaults[name]
		if want == nil {
			if p.Value.Default != nil {
				t.Errorf("Contract.%s: the spec gives default %v; DefaultContract leaves it to be derived", name, p.Value.Default)
			}
			continue
		}
		if !reflect.DeepEqual(p.Value.Default, want) {
			t.Errorf("Contract.%s: the spec gives default %#v; DefaultContract has %#v", name, p.Value.Default, want)
		}
	}
	if got := schema("Contract").Properties["dependencies"].Value.MaxItems; got == nil || *got != registry.MaxDependencies {
		t.Errorf("Contract.dependencies: maxItems is not %d", registry.MaxDependencies)
	}
	limit := doc.Components.Parameters["Limit"].Value.Schema.Value
	if limit.Default != float64(registry.DefaultPageSize) || limit.Max == nil || *limit.Max != registry.MaxPageSize || limit.Min == nil || *limit.Min != 1 {
		t.Errorf("parameter limit: default %v, range %v..%v; the server uses %d, 1..%d",
			limit.Default, limit.Min, limit.Max, registry.DefaultPageSize, registry.MaxPageSize)
	}

	// Encoded values must be valid against their schemas.
	var opts []openapi3.SchemaValidationOption
	if doc.IsOpenAPI31OrLater() {
		opts = append(opts, openapi3.EnableJSONSchema2020())
	}
	now := time.Date(2026, 5, 4, 12, 0, 0, 0, time.UTC)
	lease := now.Add(registry.DefaultLeaseTTL)
	contract := registry.DefaultContract()
	contract.Weights = map[registry.Capability]float64{registry.CapProbe: 1, registry.CapSelf: 0.5}
	contract.Dependencies = []registry.Dependency{{Name: "db", Shared: true, Authority: registry.AuthorityWeight}}
	svc := registry.Service{Name: "web", Owner: "payments", Capabilities: []registry.Capability{registry.CapProbe, registry.CapSelf}, CreatedAt: now, UpdatedAt: now}
	inst := registry.Instance{
		ID: uuid.Must(uuid.NewV7()), Service: "web", Address: "10.0.3.17", Port: 8080, Zone: "az1", Region: "eu-west-1",
		Source: registry.SourceRegistered, State: registry.StateActive, LeaseExpiresAt: &lease,
		RegisteredBy: "workload:web/alice", CreatedAt: now, UpdatedAt: now,
	}
	ended := inst
	ended.State, ended.LeaseExpiresAt, ended.EndedAt = registry.StateReplaced, nil, &now
	half, one, by := 0.5, 1.0, "operator:oscar"
	pendingFor := 61.5
	sh := shift.Shift{
		ID: uuid.Must(uuid.NewV7()), Scope: shift.ScopeZone, Target: "az1", Reason: "az1 packet loss", Manual: true,
		State: shift.PendingConfirmation, Step: 3, TrafficWeight: half, NextWeight: &one, NextStepAt: &now,
		PendingSince: &now, PendingSeconds: &pendingFor, StartedBy: by, StartedAt: now, LastStepBy: by, LastStepAt: now,
	}
	done := sh
	done.State, done.TrafficWeight, done.NextWeight, done.NextStepAt, done.PendingSeconds = shift.Completed, 1, nil, nil, nil
	done.ConfirmedBy, done.ConfirmedAt, done.EndedAt = &by, &now, &now
	prob := problem(http.StatusUnprocessableEntity, "validation", "the registration is not valid")
	prob.Instance, prob.Errors = "/v1/services/web/instances", []registry.FieldError{{Field: "port", Message: "must be between 1 and 65535, got 0"}}

	for _, tt := range []struct {
		schema string
		value  any
	}{
		{"Service", svc},
		{"ServiceSpec", registry.ServiceSpec{Owner: "payments", Capabilities: []registry.Capability{registry.CapProbe}}},
		{"Contract", contract},
		{"StoredContract", registry.StoredContract{Service: "web", Contract: contract}},
		{"StoredContract", registry.StoredContract{Service: "web", Version: 3, UpdatedAt: now, UpdatedBy: "operator:oscar", Contract: contract}},
		{"Registration", registry.Registration{Address: "2001:db8::1", Port: 443, Zone: "az2"}},
		{"Instance", inst},
		{"Instance", ended},
		{"InstanceList", list[registry.Instance]{Items: []registry.Instance{inst, ended}, NextCursor: "abc"}},
		{"ServiceList", list[registry.Service]{Items: []registry.Service{}}},
		{"AuditEventList", list[audit.Event]{Items: []audit.Event{{
			Seq: 7, At: now, ActorKind: "workload", Actor: "workload:web/alice", Action: "instance.register",
			TargetKind: "instance", Target: inst.ID.String(), Outcome: audit.Accepted,
			After: json.RawMessage(`{"id":"x"}`), Hash: strings.Repeat("ab", 32),
		}}}},
		{"Problem", prob},
		{"Shift", sh},
		{"ShiftList", list[shift.Shift]{Items: []shift.Shift{sh, done}, NextCursor: "abc"}},
		{"OverrideList", list[policy.Override]{Items: []policy.Override{{
			ID: uuid.Must(uuid.NewV7()), InstanceID: inst.ID, Service: "web", Zone: "az1", Action: policy.MarkIneligible,
			State: policy.StatePending, Actor: "operator:oscar", Justification: "serving stale prices, INC-42",
			CosignBy: &lease, BudgetDetail: "would leave 2 of 6 eligible in zone az1; the contract requires 3",
			CreatedAt: now, ExpiresAt: now.Add(time.Hour),
		}, {
			ID: uuid.Must(uuid.NewV7()), InstanceID: inst.ID, Service: "web", Zone: "az1", Action: policy.Deregister,
			State: policy.StateApplied, Actor: "operator:oscar", Justification: "host is being decommissioned, CHG-7",
			CreatedAt: now, EndedAt: &now,
		}}}},
		{"ContractPreview", preview.Result{Service: "web", From: now.Add(-10 * time.Minute), To: now, Instances: 3, Windows: 180,
			Current: preview.Outcome{Final: preview.Counts{Eligible: 3}, Guard: preview.Guard{MinHealthyFraction: 0.5, Zones: []string{}},
				Timeline: []preview.Point{{At: now.Add(-10 * time.Minute), Counts: preview.Counts{Unknown: 3}}}},
			Proposed: preview.Outcome{Removed: 2, Removals: 2, FirstRemovalAt: &now, PeakIneligible: 2, PeakAt: &now,
				Final: preview.Counts{Eligible: 1, Ineligible: 2}, Guard: preview.Guard{MinHealthyFraction: 0.5, Tripped: true, FirstTrippedAt: &now, Zones: []string{"az1"}},
				Timeline: []preview.Point{{At: now, Counts: preview.Counts{Eligible: 1, Ineligible: 2}, GuardTripped: 1}}},
			Differences: []preview.Difference{{InstanceID: inst.ID, Zone: "az1", Current: preview.Verdict{Final: "eligible", Worst: "eligible"},
				Proposed: preview.Verdict{Final: "ineligible", Worst: "ineligible", Removals: 1, FirstRemovedAt: &now}}},
			DiffsTotal: 1}},
		{"DeregisterRequest", policy.DeregisterRequest{Justification: "host is being decommissioned, CHG-7"}},
		{"OverrideMark", evaluator.Override{ID: inst.ID, Action: "mark_eligible", Actor: "operator:oscar", Justification: "probe path broken", ExpiresAt: now}},
		{"OverrideRequest", policy.Request{InstanceID: inst.ID.String(), Action: policy.MarkEligible, Justification: "probe path is broken", ExpiresIn: 600}},
		{"RenewalBatch", renewalBatch{Renewals: []renewalItem{{InstanceID: inst.ID.String(), Credential: "c2VjcmV0"}, {InstanceID: ended.ID.String()}}}},
		{"RenewalResults", renewalResults{Renewed: 1, Results: []registry.RenewalResult{
			{InstanceID: inst.ID, Outcome: registry.RenewalRenewed, LeaseExpiresAt: &lease},
			{InstanceID: ended.ID, Outcome: registry.RenewalEnded, Detail: "instance has ended (replaced); register again to get a new instance"},
			{InstanceID: uuid.Must(uuid.NewV7()), Outcome: registry.RenewalNotFound, Detail: "no instance"},
			{InstanceID: uuid.Must(uuid.NewV7()), Outcome: registry.RenewalForbidden, Detail: "wrong credential"},
			{InstanceID: uuid.Must(uuid.NewV7()), Outcome: registry.RenewalNoLease, Detail: "reconciled"},
		}}},
	} {
		raw, err := json.Marshal(tt.value)
		if err != nil {
			t.Fatal(err)
		}
		var v any
		if err := json.Unmarshal(raw, &v); err != nil {
			t.Fatal(err)
		}
		if err := schema(tt.schema).VisitJSON(v, opts...); err != nil {
			t.Errorf("%s does not match schema %s: %v", raw, tt.schema, err)
		}
	}

	// And the schemas are not so loose that anything passes.
	for _, tt := range []struct{ schema, value string }{
		{"Registration", `{"address":"10.0.0.1","port":0,"zone":"az1"}`},
		{"Registration", `{"address":"10.0.0.1","port":80,"zone":"az1","weight":3}`},
		{"Contract", `{"removal_threshold":1}`},
		{"Contract", `{"weights":{"readiness":1}}`},
		{"Dependency", `{"name":"db","authority":"drain"}`},
		{"Instance", `{"id":"x"}`},
		{"Problem", `{"title":"Not Found","status":404}`},
		{"ShiftRequest", `{"scope":"zone","target":"az1","reason":"a good long reason"}`},
		{"ShiftRequest", `{"scope":"cell","target":"az1","reason":"a good long reason","manual":true}`},
		{"OverrideRequest", `{"instance_id":"01a2283a-b7ac-755e-9d2d-ba88e0e589c9","action":"drain","justification":"because it is broken"}`},
		{"OverrideRequest", `{"instance_id":"01a2283a-b7ac-755e-9d2d-ba88e0e589c9","action":"mark_eligible","justification":"because it is broken","expires_in":0.5}`},
		{"RenewalBatch", `{"renewals":[]}`},
		{"RenewalBatch", `{"renewals":[{"credential":"x"}]}`},
		{"RenewalResult", `{"instance_id":"01a2283a-b7ac-755e-9d2d-ba88e0e589c9","outcome":"lost"}`},
	} {
		var v any
		if err := json.Unmarshal([]byte(tt.value), &v); err != nil {
			t.Fatal(err)
		}
		if err := schema(tt.schema).VisitJSON(v, opts...); err == nil {
			t.Errorf("%s is valid against schema %s; it should not be", tt.value, tt.schema)
		}
	}
}
