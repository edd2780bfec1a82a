package reconcile

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

// Kubernetes mapping defaults.
const (
	// DefaultServiceAnnotation on a Kubernetes Service names the muster
	// service its endpoints belong to.
	DefaultServiceAnnotation = "muster.io/service"
	// DefaultPortAnnotation names the Service port (by name or number)
	// whose endpoints are the instances; the first port when absent.
	DefaultPortAnnotation = "muster.io/port"
)

// NoZone is the zone of an endpoint whose node has no zone label.
const NoZone = "unzoned"

// KubernetesConfig configures one cluster.
type KubernetesConfig struct {
	// Cluster makes the source k8s/<Cluster>.
	Cluster string
	// Client is the cluster's clientset. Production builds it from
	// Kubeconfig/Context or the in-cluster config (KubernetesClient);
	// the tests pass client-go's fake clientset (no API server runs here).
	Client kubernetes.Interface
	// Namespace limits the watch to one namespace ("" = all).
	Namespace string
	// Selector, when set, is a label selector a Service must match too.
	Selector string
	// Annotation and PortAnnotation default to DefaultServiceAnnotation
	// and DefaultPortAnnotation.
	Annotation, PortAnnotation string
	// Members are the namespaces whose Services may supply each muster
	// service's members while that service names no member sources of
	// its own (the default; docs/reconciliation.md), by muster service.
	// The reconcile config's members and its issuer's service_accounts
	// fill it.
	Members map[string][]string
	// Resync is the informers' resync period (0: none).
	Resync time.Duration
	Now    func() time.Time
}

// KubernetesClient builds a clientset from a kubeconfig file and context,
// or the in-cluster config when kubeconfig is "".
func KubernetesClient(kubeconfig, context string) (kubernetes.Interface, error) {
	var (
		rc  *rest.Config
		err error
	)
	if kubeconfig == "" {
		rc, err = rest.InClusterConfig()
	} else {
		rc, err = clientcmd.NewNonInteractiveDeferredLoadingClientConfig(
			&clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig},
			&clientcmd.ConfigOverrides{CurrentContext: context}).ClientConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes client config: %w", err)
	}
	rc.Timeout = 30 * time.Second
	return kubernetes.NewForConfig(rc)
}

// KubernetesSource reads a cluster's EndpointSlices (discovery.k8s.io/v1)
// and the Services they belong to through client-go shared informers. It
// needs list and watch on both, nothing else. Its reading is the
// informers' cache: when a watch is lost the informer relists and
// rewatches with backoff, and until it has, the cache (and so the
// reading) keeps its last state, marked stale (fail-static).
type KubernetesSource struct {
	cfg      KubernetesConfig
	selector labels.Selector
	factory  informers.SharedInformerFactory
	slices   cache.SharedIndexInformer
	services cache.SharedIndexInformer
	changed  chan struct{}
	stop     chan struct{}
	stopOnce sync.Once

	mu       sync.Mutex
	stale    string
	staleAt  time.Time
	lastNews time.Time
}

// NewKubernetesSource checks cfg and builds the informers (not started).
func NewKubernetesSource(cfg KubernetesConfig) (*KubernetesSource, error) {
	if !validName(cfg.Cluster) {
		return nil, fmt.Errorf("kubernetes cluster name %q must be a DNS label", cfg.Cluster)
	}
	if cfg.Client == nil {
		return nil, fmt.Errorf("kubernetes cluster %s: no client", cfg.Cluster)
	}
	if cfg.Annotation == "" {
		cfg.Annotation = DefaultServiceAnnotation
	}
	if cfg.PortAnnotation == "" {
		cfg.PortAnnotation = DefaultPortAnnotation
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	sel := labels.Everything()
	if cfg.Selector != "" {
		var err error
		if sel, err = labels.Parse(cfg.Selector); err != nil {
			return nil, fmt.Errorf("kubernetes cluster %s: selector: %w", cfg.Cluster, err)
		}
	}
	s := &KubernetesSource{cfg: cfg, selector: sel, changed: make(chan struct{}, 1), stop: make(chan struct{})}
	s.factory = informers.NewSharedInformerFactoryWithOptions(cfg.Client, cfg.Resync, informers.WithNamespace(cfg.Namespace))
	s.slices = s.factory.Discovery().V1().EndpointSlices().Informer()
	s.services = s.factory.Core().V1().Services().Informer()
	for _, inf := range []cache.SharedIndexInformer{s.slices, s.services} {
		if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) { s.watchLost(err) }); err != nil {
			return nil, fmt.Errorf("kubernetes cluster %s: %w", cfg.Cluster, err)
		}
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(any) { s.news() },
			UpdateFunc: func(any, any) { s.news() },
			DeleteFunc: func(any) { s.news() },
		}); err != nil {
			return nil, fmt.Errorf("kubernetes cluster %s: %w", cfg.Cluster, err)
		}
	}
	return s, nil
}

// Name is k8s/<cluster>.
func (s *KubernetesSource) Name() string { return "k8s/" + s.cfg.Cluster }

// Start starts the informers.
func (s *KubernetesSource) Start(context.Context) error {
	s.factory.Start(s.stop)
	return nil
}

// Stop stops the informers and waits for them.
func (s *KubernetesSource) Stop() {
	s.stopOnce.Do(func() {
		close(s.stop)
		s.factory.Shutdown()
	})
}

// Changed fires after informer events.
func (s *KubernetesSource) Changed() <-chan struct{} { return s.changed }

func (s *KubernetesSource) news() {
	s.mu.Lock()
	s.lastNews = s.cfg.Now()
	s.stale = "" // the watch delivers again
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

func (s *KubernetesSource) watchLost(err error) {
	s.mu.Lock()
	if s.stale == "" {
		s.staleAt = s.cfg.Now()
	}
	s.stale = fmt.Sprintf("the watch of cluster %s was lost since %s (%v); relisting with backoff", s.cfg.Cluster, s.staleAt.UTC().Format(time.RFC3339), err)
	s.mu.Unlock()
	select {
	case s.changed <- struct{}{}:
	default:
	}
}

// ErrNotSynced is Read's answer before a source's first full listing: no
// reading yet, nothing to believe (the worker waits for the next pass
// without counting an error).
var ErrNotSynced = errors.New("the informers have not synced yet")

// Read returns every endpoint of every mapped Service in the cache.
func (s *KubernetesSource) Read(context.Context) (Reading, error) {
	if !s.slices.HasSynced() || !s.services.HasSynced() {
		return Reading{}, ErrNotSynced
	}
	type mapped struct {
		service, port, namespace, name string
		labels                         map[string]string
	}
	svcs := map[string]mapped{}
	for _, o := range s.services.GetStore().List() {
		svc, ok := o.(*corev1.Service)
		if !ok {
			continue
		}
		name := svc.Annotations[s.cfg.Annotation]
		if name == "" || !s.selector.Matches(labels.Set(svc.Labels)) {
			continue
		}
		svcs[svc.Namespace+"/"+svc.Name] = mapped{service: name, port: svc.Annotations[s.cfg.PortAnnotation],
			namespace: svc.Namespace, name: svc.Name, labels: svc.Labels}
	}
	var out []Endpoint
	for _, o := range s.slices.GetStore().List() {
		sl, ok := o.(*discoveryv1.EndpointSlice)
		if !ok {
			continue
		}
		if sl.AddressType != discoveryv1.AddressTypeIPv4 && sl.AddressType != discoveryv1.AddressTypeIPv6 {
			continue // FQDN slices name no address muster can route to
		}
		owner := sl.Labels[discoveryv1.LabelServiceName]
		m, ok := svcs[sl.Namespace+"/"+owner]
		if !ok || !validName(m.service) {
			continue
		}
		port, ok := slicePort(sl, m.port)
		if !ok {
			continue
		}
		for _, ep := range sl.Endpoints {
			if len(ep.Addresses) == 0 {
				continue
			}
			e := Endpoint{Service: m.service, Address: ep.Addresses[0], Port: port, Namespace: m.namespace, KubeService: m.name,
				Labels: m.labels, Vouched: slices.Contains(s.cfg.Members[m.service], m.namespace)}
			// Conditions: nil ready means ready (the API's rule); nil
			// serving follows ready; nil terminating is false.
			e.Ready = ep.Conditions.Ready == nil || *ep.Conditions.Ready
			e.Serving = e.Ready
			if ep.Conditions.Serving != nil {
				e.Serving = *ep.Conditions.Serving
			}
			e.Terminating = ep.Conditions.Terminating != nil && *ep.Conditions.Terminating
			// The endpoint's zone (the node's topology.kubernetes.io/zone);
			// a cluster without zones is one zone as far as the guard goes.
			e.Zone = NoZone
			if ep.Zone != nil && validName(*ep.Zone) {
				e.Zone = *ep.Zone
			}
			// The pod's UID: never reused, so a restarted pod (a new UID)
			// is a new instance.
			if ep.TargetRef != nil && ep.TargetRef.UID != "" {
				e.Key = string(ep.TargetRef.UID)
			} else {
				e.Key = "address/" + e.Address
			}
			out = append(out, e)
		}
	}
	s.mu.Lock()
	r := Reading{Endpoints: out, Stale: s.stale, At: s.lastNews}
	s.mu.Unlock()
	if r.At.IsZero() {
		r.At = s.cfg.Now()
	}
	return r, nil
}

// slicePort picks the slice's port named (or numbered) want, or its first.
func slicePort(sl *discoveryv1.EndpointSlice, want string) (int, bool) {
	for _, p := range sl.Ports {
		if p.Port == nil {
			continue
		}
		if want == "" || (p.Name != nil && *p.Name == want) || strconv.Itoa(int(*p.Port)) == want {
			return int(*p.Port), true
		}
	}
	return 0, false
}
