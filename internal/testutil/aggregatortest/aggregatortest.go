// Package aggregatortest starts an envtest control plane with the aggregation layer on, so
// that an API server started inside a test is reached through the real kube-apiserver:
// front-proxy client certificates and requestheader flags, and an APIService whose Service
// is an ExternalName for 127.0.0.1 (Endpoints and EndpointSlices refuse loopback addresses,
// so endpoint routing cannot reach an in-test server; the aggregator dials an ExternalName
// as it is, and there is no kube-proxy to need). Every user of the test control plane is authenticated by
// client certificate and authorized by RBAC, as in a cluster.
package aggregatortest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	"github.com/vancetope/lease-operator/internal/testutil/envtestbin"
)

// frontProxyUser is the common name of the aggregator's client certificate; the
// aggregated server accepts request headers only from it.
const frontProxyUser = "front-proxy-client"

// Env is a running control plane with aggregation.
type Env struct {
	// Env is the envtest environment.
	Env *envtest.Environment
	// Config is an administrator's (system:masters) configuration.
	Config *rest.Config
	// AdminKubeconfig is the path of an administrator's kubeconfig file: for the delegated
	// authentication and authorization of the in-test server, and for kubectl.
	AdminKubeconfig string
	// Dir holds the generated certificates and kubeconfig files.
	Dir string
}

// Start starts the control plane with the front-proxy flags set; crdPaths are installed
// (ErrorIfCRDPathMissing).
func Start(crdPaths ...string) (*Env, error) { return StartWithWebhooks("", crdPaths...) }

// StartWithWebhooks is Start that also installs the webhook configurations of webhookDir
// ("" none), pointed at a server on 127.0.0.1 with certificates envtest generates (the
// environment's WebhookInstallOptions: LocalServingPort, LocalServingCertDir).
func StartWithWebhooks(webhookDir string, crdPaths ...string) (*Env, error) {
	assets, err := envtestbin.AssetsDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "aggregatortest-")
	if err != nil {
		return nil, err
	}
	flags, err := FrontProxyFlags(dir)
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		BinaryAssetsDirectory: assets,
		CRDDirectoryPaths:     crdPaths,
		ErrorIfCRDPathMissing: len(crdPaths) > 0,
	}
	if webhookDir != "" {
		env.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: []string{webhookDir}, LocalServingHost: "127.0.0.1"}
	}
	args := env.ControlPlane.GetAPIServer().Configure()
	for k, v := range flags {
		args.Set(k, v)
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	e := &Env{Env: env, Config: cfg, Dir: dir}
	admin, err := env.AddUser(envtest.User{Name: "test-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		_ = e.Stop()
		return nil, err
	}
	if e.AdminKubeconfig, err = writeKubeconfig(dir, "admin", admin); err != nil {
		_ = e.Stop()
		return nil, err
	}
	return e, nil
}

// Stop stops the control plane and removes the files.
func (e *Env) Stop() error {
	err := e.Env.Stop()
	_ = os.RemoveAll(e.Dir)
	return err
}

// User adds a user authenticated by client certificate (no groups beyond
// system:authenticated unless given) and returns its configuration and kubeconfig file.
func (e *Env) User(name string, groups ...string) (*rest.Config, string, error) {
	u, err := e.Env.AddUser(envtest.User{Name: name, Groups: groups}, nil)
	if err != nil {
		return nil, "", err
	}
	path, err := writeKubeconfig(e.Dir, name, u)
	if err != nil {
		return nil, "", err
	}
	return u.Config(), path, nil
}

func writeKubeconfig(dir, name string, u *envtest.AuthenticatedUser) (string, error) {
	b, err := u.KubeConfig()
	if err != nil {
		return "", err
	}
	path := filepath.Join(dir, name+".kubeconfig")
	return path, os.WriteFile(path, b, 0o600)
}

// Register makes the server listening on 127.0.0.1:port serve gv through the control
// plane: an ExternalName Service in namespace and an APIService (TLS not verified: the in-test server's certificate is
// self-signed). It returns when discovery lists gv.
func (e *Env) Register(ctx context.Context, gv schema.GroupVersion, namespace string, port int) error {
	if err := RegisterAPIService(ctx, e.Config, gv, namespace, port); err != nil {
		return err
	}
	return WaitServed(ctx, e.Config, gv)
}

// RegisterAPIService creates the Service and APIService of Register without waiting for the
// server (which may start later, as with make run).
func RegisterAPIService(ctx context.Context, config *rest.Config, gv schema.GroupVersion, namespace string, port int) error {
	cs, err := kubernetes.NewForConfig(config)
	if err != nil {
		return err
	}
	name := "aggregated-" + strconv.Itoa(port)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return err
	}
	// Endpoints may not point at loopback, so the Service is an ExternalName for
	// 127.0.0.1, which the aggregator (without endpoint routing) dials as it is.
	svc := &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec:       corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "127.0.0.1"},
	}
	if _, err := cs.CoreV1().Services(namespace).Create(ctx, svc, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating service: %w", err)
	}
	dyn, err := dynamic.NewForConfig(config)
	if err != nil {
		return err
	}
	apiService := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apiregistration.k8s.io/v1",
		"kind":       "APIService",
		"metadata":   map[string]any{"name": gv.Version + "." + gv.Group},
		"spec": map[string]any{
			"group": gv.Group, "version": gv.Version,
			"groupPriorityMinimum": int64(1000), "versionPriority": int64(15),
			"insecureSkipTLSVerify": true,
			"service":               map[string]any{"name": name, "namespace": namespace, "port": int64(port)},
		},
	}}
	apiServices := schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}
	if _, err := dyn.Resource(apiServices).Create(ctx, apiService, metav1.CreateOptions{}); err != nil {
		return fmt.Errorf("creating APIService: %w", err)
	}
	return nil
}

// WaitServed returns when discovery lists gv (at most a minute).
func WaitServed(ctx context.Context, config *rest.Config, gv schema.GroupVersion) error {
	dc, err := discovery.NewDiscoveryClientForConfig(config)
	if err != nil {
		return err
	}
	return wait.PollUntilContextTimeout(ctx, 200*time.Millisecond, 60*time.Second, true, func(context.Context) (bool, error) {
		_, err := dc.ServerResourcesForGroupVersion(gv.String())
		return err == nil, nil
	})
}

// FrontProxyFlags writes a front-proxy CA and client certificate into dir and returns the
// kube-apiserver flags of the aggregation layer that use them (for a control plane started
// otherwise, such as the end-to-end suite's).
func FrontProxyFlags(dir string) (map[string]string, error) {
	caFile, certFile, keyFile, err := writeFrontProxyCerts(dir)
	if err != nil {
		return nil, err
	}
	return map[string]string{
		"requestheader-client-ca-file":       caFile,
		"requestheader-allowed-names":        frontProxyUser,
		"requestheader-username-headers":     "X-Remote-User",
		"requestheader-group-headers":        "X-Remote-Group",
		"requestheader-extra-headers-prefix": "X-Remote-Extra-",
		"proxy-client-cert-file":             certFile,
		"proxy-client-key-file":              keyFile,
	}, nil
}

// writeFrontProxyCerts writes a CA and the aggregator's client certificate signed by it.
func writeFrontProxyCerts(dir string) (caFile, certFile, keyFile string, err error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "front-proxy-ca"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return "", "", "", err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return "", "", "", err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", "", err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: frontProxyUser},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		return "", "", "", err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return "", "", "", err
	}
	caFile, certFile, keyFile = filepath.Join(dir, "front-proxy-ca.crt"), filepath.Join(dir, "front-proxy-client.crt"), filepath.Join(dir, "front-proxy-client.key")
	for path, block := range map[string]*pem.Block{
		caFile:   {Type: "CERTIFICATE", Bytes: caDER},
		certFile: {Type: "CERTIFICATE", Bytes: der},
		keyFile:  {Type: "EC PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return "", "", "", err
		}
	}
	return caFile, certFile, keyFile, nil
}

// FreePort returns a loopback listener on a free port, and the port.
func FreePort() (net.Listener, int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, 0, err
	}
	return l, l.Addr().(*net.TCPAddr).Port, nil
}
