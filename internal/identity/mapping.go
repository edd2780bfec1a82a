package identity

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Claim mapping types: platform issuers whose tokens cannot carry muster's
// claims.
const (
	// MappingKubernetes reads a projected service-account token: the
	// "kubernetes.io" claim's namespace and serviceaccount.name map to a
	// muster service, and its pod.uid binds the token to that pod's
	// reconciled instance.
	MappingKubernetes = "kubernetes"
	// MappingAWS reads an AWS web-identity token: the role of the role
	// session ARN in Claim ("sub" by default), with its account
	// ("ACCOUNT:role/NAME", AWSRoleKey), maps to a muster service.
	MappingAWS = "aws"
)

// ClaimMapping turns a platform issuer's own claims into a workload
// principal. An issuer with a mapping is trusted for workloads only, and
// only for the services its mapping names: it can never mint an operator,
// a tool, a prober or a role, and a token of it carrying muster's own
// claims is refused as a misconfiguration (or a forgery attempt).
type ClaimMapping struct {
	// Type is MappingKubernetes or MappingAWS.
	Type string
	// Cluster is the reconciliation cluster (source k8s/<Cluster>) whose
	// pods the issuer's tokens speak for (Kubernetes only).
	Cluster string
	// Services maps "namespace/serviceaccount" (Kubernetes) or an IAM role
	// with its account, "ACCOUNT:role/NAME" (AWS), to a muster service: a
	// role name alone would let another account's role of the same name
	// speak for the service.
	Services map[string]string
	// Claim is the claim holding the role session ARN (AWS; "sub" when
	// empty).
	Claim string
}

// Validate checks the mapping.
func (m *ClaimMapping) Validate() error {
	switch m.Type {
	case MappingKubernetes:
		if !validServiceName(m.Cluster) {
			return fmt.Errorf("kubernetes mapping: cluster %q must be a DNS label (the reconcile source k8s/<cluster>)", m.Cluster)
		}
		for k := range m.Services {
			if ns, sa, ok := strings.Cut(k, "/"); !ok || ns == "" || sa == "" || strings.Contains(sa, "/") {
				return fmt.Errorf("kubernetes mapping: key %q must be namespace/serviceaccount", k)
			}
		}
	case MappingAWS:
		if m.Claim == "" {
			m.Claim = "sub"
		}
		for k := range m.Services {
			if _, _, ok := parseAWSRoleKey(k); ok {
				continue
			}
			if !strings.ContainsAny(k, ":/") {
				return fmt.Errorf("aws mapping: key %q is a role name alone; name the role with its account, ACCOUNT:role/%s (e.g. 123456789012:role/%s), so that another account's role of the same name does not speak for the service", k, k, k)
			}
			return fmt.Errorf("aws mapping: key %q must be ACCOUNT:role/NAME (a 12-digit account id and the role's name, without its path)", k)
		}
	default:
		return fmt.Errorf("mapping type %q: want kubernetes or aws", m.Type)
	}
	if len(m.Services) == 0 {
		return errors.New("mapping names no services")
	}
	for k, s := range m.Services {
		if !validServiceName(s) {
			return fmt.Errorf("mapping %q: %q is not a service name", k, s)
		}
	}
	return nil
}

// k8sClaims is the "kubernetes.io" claim of a projected service-account
// token.
type k8sClaims struct {
	Namespace      string `json:"namespace"`
	ServiceAccount struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"serviceaccount"`
	Pod *struct {
		Name string `json:"name"`
		UID  string `json:"uid"`
	} `json:"pod"`
}

// principal maps a verified token's claims.
func (m *ClaimMapping) principal(iss, sub string, claims map[string]json.RawMessage) (Principal, error) {
	for _, c := range []string{ClaimKind, ClaimService, ClaimTeam, ClaimRole, ClaimAddresses} {
		if _, ok := claims[c]; ok {
			return Principal{}, fmt.Errorf("claim %s from a %s-mapped issuer, which is trusted for mapped workloads only", c, m.Type)
		}
	}
	var service, pod string
	switch m.Type {
	case MappingKubernetes:
		raw, ok := claims["kubernetes.io"]
		if !ok {
			return Principal{}, errors.New("no kubernetes.io claim")
		}
		var k k8sClaims
		if err := json.Unmarshal(raw, &k); err != nil {
			return Principal{}, errors.New("claim kubernetes.io has the wrong type")
		}
		key := k.Namespace + "/" + k.ServiceAccount.Name
		if service = m.Services[key]; service == "" {
			return Principal{}, fmt.Errorf("service account %s is not mapped to a muster service", QuoteClaim(key))
		}
		if k.Pod != nil {
			if k.Pod.UID == "" || !printable(k.Pod.UID, 64) {
				return Principal{}, errors.New("bad pod uid")
			}
			pod = k.Pod.UID
		}
	case MappingAWS:
		var arn string
		if raw, ok := claims[m.Claim]; !ok || json.Unmarshal(raw, &arn) != nil {
			return Principal{}, fmt.Errorf("no %s claim holding a role ARN", m.Claim)
		}
		account, name := awsRole(arn)
		if name == "" {
			return Principal{}, fmt.Errorf("claim %s is not a role session or role ARN", m.Claim)
		}
		role := AWSRoleKey(account, name)
		if service = m.Services[role]; service == "" {
			return Principal{}, fmt.Errorf("role %s is not mapped to a muster service", QuoteClaim(role))
		}
	}
	p, err := NewPrincipal(iss, sub, Claims{Kind: string(KindWorkload), Service: service})
	if err != nil {
		return Principal{}, err
	}
	if pod != "" {
		p.Pod, p.Cluster = pod, m.Cluster
	}
	return p, nil
}

// AWSRoleKey names an IAM role in an AWS mapping: "ACCOUNT:role/NAME",
// as the role's ARN ends (arn:aws:iam::ACCOUNT:role/NAME) without its
// path. Role names are unique within an account, not across accounts.
func AWSRoleKey(account, name string) string { return account + ":role/" + name }

// parseAWSRoleKey splits an AWSRoleKey.
func parseAWSRoleKey(k string) (account, name string, ok bool) {
	account, name, ok = strings.Cut(k, ":role/")
	if !ok || !awsAccount(account) || name == "" || strings.ContainsAny(name, "/:") {
		return "", "", false
	}
	return account, name, true
}

// awsAccount reports whether s is an AWS account id: 12 digits.
func awsAccount(s string) bool {
	if len(s) != 12 {
		return false
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// awsRole is the account and role name of an assumed-role session ARN
// (arn:aws:sts::123456789012:assumed-role/ROLE/SESSION) or a role ARN
// (arn:aws:iam::123456789012:role/path/ROLE); "" for anything else.
func awsRole(arn string) (account, name string) {
	parts := strings.SplitN(arn, ":", 6)
	if len(parts) != 6 || parts[0] != "arn" || !awsAccount(parts[4]) {
		return "", ""
	}
	account, res := parts[4], parts[5]
	switch {
	case parts[2] == "sts" && strings.HasPrefix(res, "assumed-role/"):
		role, _, ok := strings.Cut(strings.TrimPrefix(res, "assumed-role/"), "/")
		if !ok || role == "" {
			return "", ""
		}
		return account, role
	case parts[2] == "iam" && strings.HasPrefix(res, "role/"):
		segs := strings.Split(res, "/")
		if segs[len(segs)-1] == "" {
			return "", ""
		}
		return account, segs[len(segs)-1]
	}
	return "", ""
}
