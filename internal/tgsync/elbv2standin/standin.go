// Package elbv2standin is a STAND-IN for the AWS ELBv2 API, which cannot
// run here: an in-process HTTP handler speaking the AWS Query protocol
// (form-encoded POST, XML answers, AWS error documents) for the five
// operations muster tgsync calls: DescribeTargetGroups,
// DescribeTargetGroupAttributes, DescribeTargetHealth, RegisterTargets
// and DeregisterTargets. Tests and `muster loadgen tgsync` point the real
// AWS SDK at it (static credentials, a base endpoint), so the SDK's
// serialisation, its retryer and its SigV4 signing are the real ones; the
// stand-in checks that every request is signed with the expected access
// key. It is not AWS: target health is "healthy" on registration, and a
// deregistered target stays "draining" until it is registered again or
// Forget is called.
package elbv2standin

import (
	"encoding/xml"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// Namespace is the ELBv2 API's XML namespace.
const Namespace = "http://elasticloadbalancing.amazonaws.com/doc/2015-12-01/"

// StandIn holds target groups and answers the API.
type StandIn struct {
	// AccessKey is the access key id every request must be signed with
	// ("" accepts any signed request).
	AccessKey string

	mu       sync.Mutex
	groups   map[string]*group
	throttle map[string]int
	fail     map[string]int
	calls    map[string]int
}

type group struct {
	typ       string
	port      int
	slowStart int
	targets   map[string]string // "id:port" -> state
}

// New returns an empty stand-in.
func New(accessKey string) *StandIn {
	return &StandIn{AccessKey: accessKey, groups: map[string]*group{}, throttle: map[string]int{}, fail: map[string]int{}, calls: map[string]int{}}
}

// AddGroup creates a target group: its type ("ip", "instance"), port and
// slow_start.duration_seconds (0: off).
func (s *StandIn) AddGroup(arn, targetType string, port, slowStart int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups[arn] = &group{typ: targetType, port: port, slowStart: slowStart, targets: map[string]string{}}
}

// Put adds a target as if registered by someone else (by hand).
func (s *StandIn) Put(arn, id string, port int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.groups[arn].targets[id+":"+strconv.Itoa(port)] = "healthy"
}

// Remove takes a target out at once, as if deregistered by hand and
// drained.
func (s *StandIn) Remove(arn, id string, port int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.groups[arn].targets, id+":"+strconv.Itoa(port))
}

// Forget ends every draining target's deregistration delay.
func (s *StandIn) Forget(arn string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, st := range s.groups[arn].targets {
		if st == "draining" {
			delete(s.groups[arn].targets, k)
		}
	}
}

// Throttle makes the next n calls of action answer Throttling (HTTP 400).
func (s *StandIn) Throttle(action string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.throttle[action] = n
}

// Fail makes the next n calls of action answer a non-retryable
// ValidationError.
func (s *StandIn) Fail(action string, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail[action] = n
}

// Targets lists a group's targets as "id:port state", sorted.
func (s *StandIn) Targets(arn string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, st := range s.groups[arn].targets {
		out = append(out, k+" "+st)
	}
	slices.Sort(out)
	return out
}

// Registered lists a group's targets that are not draining, "id:port",
// sorted.
func (s *StandIn) Registered(arn string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for k, st := range s.groups[arn].targets {
		if st != "draining" {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Calls returns how many requests each action got (throttled ones
// included), and the total.
func (s *StandIn) Calls() (map[string]int, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]int{}
	total := 0
	for k, v := range s.calls {
		out[k] = v
		total += v
	}
	return out, total
}

// ServeHTTP answers one Query-protocol request.
func (s *StandIn) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		s.error(w, 405, "Sender", "InvalidAction", "POST only")
		return
	}
	auth := r.Header.Get("Authorization")
	if !strings.HasPrefix(auth, "AWS4-HMAC-SHA256 Credential=") || (s.AccessKey != "" && !strings.Contains(auth, "Credential="+s.AccessKey+"/")) ||
		!strings.Contains(auth, "/elasticloadbalancing/aws4_request") || !strings.Contains(auth, "Signature=") {
		s.error(w, 403, "Sender", "InvalidClientTokenId", "the request is not signed with the expected credentials")
		return
	}
	if err := r.ParseForm(); err != nil {
		s.error(w, 400, "Sender", "MalformedQueryString", err.Error())
		return
	}
	f := r.PostForm
	action := f.Get("Action")
	if f.Get("Version") != "2015-12-01" {
		s.error(w, 400, "Sender", "InvalidParameterValue", "Version must be 2015-12-01")
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls[action]++
	if s.throttle[action] > 0 {
		s.throttle[action]--
		s.error(w, 400, "Sender", "Throttling", "Rate exceeded")
		return
	}
	if s.fail[action] > 0 {
		s.fail[action]--
		s.error(w, 400, "Sender", "ValidationError", "the stand-in was told to fail this call")
		return
	}
	switch action {
	case "DescribeTargetGroups":
		var b strings.Builder
		for i := 1; ; i++ {
			arn := f.Get("TargetGroupArns.member." + strconv.Itoa(i))
			if arn == "" {
				break
			}
			g, ok := s.groups[arn]
			if !ok {
				s.error(w, 400, "Sender", "TargetGroupNotFound", "One or more target groups not found")
				return
			}
			fmt.Fprintf(&b, "<member><TargetGroupArn>%s</TargetGroupArn><TargetType>%s</TargetType><Port>%d</Port><Protocol>HTTP</Protocol></member>", esc(arn), esc(g.typ), g.port)
		}
		s.ok(w, action, "<TargetGroups>"+b.String()+"</TargetGroups>")
	case "DescribeTargetGroupAttributes":
		g, ok := s.group(w, f.Get("TargetGroupArn"))
		if !ok {
			return
		}
		s.ok(w, action, fmt.Sprintf("<Attributes><member><Key>deregistration_delay.timeout_seconds</Key><Value>300</Value></member>"+
			"<member><Key>slow_start.duration_seconds</Key><Value>%d</Value></member></Attributes>", g.slowStart))
	case "DescribeTargetHealth":
		g, ok := s.group(w, f.Get("TargetGroupArn"))
		if !ok {
			return
		}
		var b strings.Builder
		keys := make([]string, 0, len(g.targets))
		for k := range g.targets {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		for _, k := range keys {
			i := strings.LastIndexByte(k, ':')
			fmt.Fprintf(&b, "<member><Target><Id>%s</Id><Port>%s</Port></Target><HealthCheckPort>%s</HealthCheckPort><TargetHealth><State>%s</State></TargetHealth></member>",
				esc(k[:i]), k[i+1:], k[i+1:], g.targets[k])
		}
		s.ok(w, action, "<TargetHealthDescriptions>"+b.String()+"</TargetHealthDescriptions>")
	case "RegisterTargets", "DeregisterTargets":
		g, ok := s.group(w, f.Get("TargetGroupArn"))
		if !ok {
			return
		}
		var keys []string
		for i := 1; ; i++ {
			p := "Targets.member." + strconv.Itoa(i)
			id := f.Get(p + ".Id")
			if id == "" {
				break
			}
			port := g.port
			if ps := f.Get(p + ".Port"); ps != "" {
				n, err := strconv.Atoi(ps)
				if err != nil || n < 1 || n > 65535 {
					s.error(w, 400, "Sender", "ValidationError", "invalid port "+ps)
					return
				}
				port = n
			}
			if g.typ == "ip" && net.ParseIP(id) == nil {
				s.error(w, 400, "Sender", "ValidationError", "The IP address '"+id+"' is not a valid IPv4 address")
				return
			}
			keys = append(keys, id+":"+strconv.Itoa(port))
		}
		if len(keys) == 0 {
			s.error(w, 400, "Sender", "ValidationError", "Targets must not be empty")
			return
		}
		for _, k := range keys {
			if action == "RegisterTargets" {
				g.targets[k] = "healthy"
			} else if _, ok := g.targets[k]; ok {
				g.targets[k] = "draining"
			}
		}
		s.ok(w, action, "")
	default:
		s.error(w, 400, "Sender", "InvalidAction", "the stand-in does not implement "+action)
	}
}

func (s *StandIn) group(w http.ResponseWriter, arn string) (*group, bool) {
	g, ok := s.groups[arn]
	if !ok {
		s.error(w, 400, "Sender", "TargetGroupNotFound", "Target groups '"+arn+"' not found")
	}
	return g, ok
}

func (s *StandIn) ok(w http.ResponseWriter, action, result string) {
	w.Header().Set("Content-Type", "text/xml")
	fmt.Fprintf(w, `<%sResponse xmlns="%s"><%sResult>%s</%sResult><ResponseMetadata><RequestId>standin</RequestId></ResponseMetadata></%sResponse>`,
		action, Namespace, action, result, action, action)
}

func (s *StandIn) error(w http.ResponseWriter, code int, typ, errCode, msg string) {
	w.Header().Set("Content-Type", "text/xml")
	w.WriteHeader(code)
	fmt.Fprintf(w, `<ErrorResponse xmlns="%s"><Error><Type>%s</Type><Code>%s</Code><Message>%s</Message></Error><RequestId>standin</RequestId></ErrorResponse>`,
		Namespace, typ, errCode, esc(msg))
}

func esc(s string) string {
	var b strings.Builder
	_ = xml.EscapeText(&b, []byte(s))
	return b.String()
}
