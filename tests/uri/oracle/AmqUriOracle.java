// ActiveMQ 5.17's own client as the oracle for connection URIs (tests/uri/test_uri_oracle.py).
// Run with --add-opens java.base/sun.security.ssl=ALL-UNNAMED: on JDK 17 ActiveMQ 5.17.2 cannot
// reach SSLSocketImpl's setters otherwise (later ActiveMQ releases look them up on SSLSocket).
//
// Reads URIs, one a line, from the file named by args[0] (or setters:CLASS: that class's
// one-argument setters, to check the catalogue in amqtransport/activemq_options.py); prints one
// line per input line:
//   OK <tab> key=value <tab> key=value ...   (each option given, as ActiveMQ reads it back)
//   ERR <tab> message
// A client URI (tcp/ssl/nio/nio+ssl/stomp*/failover) goes where ActiveMQConnectionFactory
// puts it: the factory takes the jms.* options, TransportFactory.connect builds (without
// connecting) the transport from the rest, and every broker URI of a failover is built the
// same way with the failover's nested.* options appended (as FailoverTransport does before
// each connect). socket.* options, which ActiveMQ applies only once the socket exists, are
// applied here to an unconnected Socket / SSLSocket, with SslTransport's verifyHostName rule.
// A static:/masterslave: URI (a network connector's) is built by DiscoveryAgentFactory; an
// option the agent does not take (ActiveMQ drops it silently) counts as invalid, and each
// service is checked as a client transport URI (without jms.*).
import java.io.*;
import java.lang.reflect.*;
import java.net.*;
import java.nio.charset.StandardCharsets;
import java.nio.file.*;
import java.util.*;
import javax.net.ssl.SSLSocketFactory;
import org.apache.activemq.ActiveMQConnectionFactory;
import org.apache.activemq.transport.Transport;
import org.apache.activemq.transport.TransportFactory;
import org.apache.activemq.transport.discovery.DiscoveryAgent;
import org.apache.activemq.transport.discovery.DiscoveryAgentFactory;
import org.apache.activemq.transport.failover.FailoverTransport;
import org.apache.activemq.transport.tcp.TcpTransport;
import org.apache.activemq.util.IntrospectionSupport;
import org.apache.activemq.util.URISupport;

public class AmqUriOracle {
  static class Invalid extends Exception { Invalid(String m) { super(m); } }

  public static void main(String[] args) throws Exception {
    List<String> lines = Files.readAllLines(Paths.get(args[0]), StandardCharsets.UTF_8);
    PrintStream out = new PrintStream(new FileOutputStream(FileDescriptor.out), true, "UTF-8");
    for (String line : lines) {
      List<String> values = new ArrayList<>();
      String answer;
      try {
        if (line.startsWith("setters:")) {
          setters(line.substring("setters:".length()), values);
        } else {
          check(line, values);
        }
        answer = "OK";
        for (String v : values) answer += "\t" + v;
      } catch (Throwable e) {
        Throwable t = e;
        while (t.getCause() != null && t.getMessage() == null) t = t.getCause();
        answer = "ERR\t" + (t.getClass().getSimpleName() + ": " + t.getMessage()).replaceAll("[\\t\\r\\n]", " ");
      }
      out.println(answer);
    }
  }

  /** The one-argument setters of a class, as name:Type (what IntrospectionSupport can call). */
  static void setters(String className, List<String> values) throws Exception {
    TreeSet<String> names = new TreeSet<>();
    for (Method m : Class.forName(className).getMethods()) {
      if (m.getName().startsWith("set") && m.getName().length() > 3 && m.getParameterCount() == 1) {
        String n = m.getName().substring(3);
        names.add(Character.toLowerCase(n.charAt(0)) + n.substring(1) + ":" + m.getParameterTypes()[0].getSimpleName());
      }
    }
    values.addAll(names);
  }

  /** ActiveMQ has no STOMP client transport (its stomp* factories serve brokers): a stomp*://
   * broker URI is asked as its OpenWire twin, which takes the same TcpTransport options. */
  static String twin(String text) {
    return text.replaceAll("(?i)stomp\\+nio\\+ssl://", "nio+ssl://").replaceAll("(?i)stomp\\+nio://", "nio://")
        .replaceAll("(?i)stomp\\+ssl://", "ssl://").replaceAll("(?i)stomp://", "tcp://");
  }

  static void check(String original, List<String> values) throws Exception {
    String text = twin(original);
    URI uri = new URI(text);
    String scheme = uri.getScheme() == null ? "" : uri.getScheme().toLowerCase(Locale.ROOT);
    if (scheme.equals("static") || scheme.equals("masterslave")) {
      network(uri, values, "");
      return;
    }
    ActiveMQConnectionFactory factory = new ActiveMQConnectionFactory(text);
    URI rest = factory.getBrokerURL() == null ? uri : new URI(factory.getBrokerURL());
    Map<String, String> given = params(uri);
    for (String key : given.keySet()) {
      if (key.startsWith("jms.")) values.add(key + "=" + read(factory, key.substring(4)));
    }
    transport(rest, values, "");
  }

  /** The options written on uri itself (a composite's own, or a broker URI's). */
  static Map<String, String> params(URI uri) throws Exception {
    String s = uri.getScheme();
    if (s != null && (s.equalsIgnoreCase("failover") || s.equalsIgnoreCase("static") || s.equalsIgnoreCase("masterslave"))) {
      return new TreeMap<>(URISupport.parseComposite(uri).getParameters());
    }
    return new TreeMap<>(URISupport.parseParameters(uri));
  }

  static void network(URI uri, List<String> values, String at) throws Exception {
    DiscoveryAgent agent = DiscoveryAgentFactory.createDiscoveryAgent(uri);
    URISupport.CompositeData data = URISupport.parseComposite(uri);
    Map<String, String> left = new TreeMap<>(data.getParameters());
    IntrospectionSupport.setProperties(agent, left);
    if (!left.isEmpty()) throw new Invalid("options the discovery agent does not take: " + left);
    for (String key : data.getParameters().keySet()) values.add(at + key + "=" + read(agent, key));
    URI[] services = data.getComponents();
    for (int i = 0; i < services.length; i++) transport(services[i], values, at + i + ".");
  }

  static void transport(URI uri, List<String> values, String at) throws Exception {
    Transport t = TransportFactory.connect(uri);
    FailoverTransport failover = t.narrow(FailoverTransport.class);
    if (failover != null) {
      Map<String, String> given = params(uri);
      for (String key : given.keySet()) {
        if (!key.startsWith("nested.")) values.add(at + key + "=" + read(failover, key));
      }
      Field nf = FailoverTransport.class.getDeclaredField("nestedExtraQueryOptions");
      nf.setAccessible(true);
      String nested = (String) nf.get(failover);
      URI[] comps = URISupport.parseComposite(uri).getComponents();
      for (int i = 0; i < comps.length; i++) {
        URI c = comps[i];
        if (nested != null && !nested.isEmpty()) {
          c = URISupport.createURIWithQuery(c, c.getQuery() == null ? nested : c.getQuery() + "&" + nested);
        }
        transport(c, values, at + i + ".");
      }
      return;
    }
    TcpTransport tcp = t.narrow(TcpTransport.class);
    if (tcp == null) throw new Invalid("not a broker transport: " + t);
    socketOptions(uri, tcp);
    Map<String, String> given = params(uri);
    for (String key : given.keySet()) {
      values.add(at + key + "=" + readLeaf(t, tcp, key));
    }
  }

  @SuppressWarnings("unchecked")
  static void socketOptions(URI uri, TcpTransport tcp) throws Exception {
    Field f = TcpTransport.class.getDeclaredField("socketOptions");
    f.setAccessible(true);
    Map<String, Object> opts = (Map<String, Object>) f.get(tcp);
    if (opts == null || opts.isEmpty()) return;
    Map<String, Object> copy = new HashMap<>(opts);
    String scheme = uri.getScheme().toLowerCase(Locale.ROOT);
    boolean ssl = scheme.endsWith("ssl");
    Socket socket;
    if (ssl) {
      copy.remove("verifyHostName");  // SslTransport.initialiseSocket takes it before the socket's
      socket = SSLSocketFactory.getDefault().createSocket();
    } else {
      socket = new Socket();
    }
    try {
      IntrospectionSupport.setProperties(socket, copy);
    } finally {
      socket.close();
    }
    if (!copy.isEmpty()) throw new Invalid("Invalid socket parameters: " + copy);
  }

  /** An option's value as the transport stack holds it (the layer that took it). */
  static String readLeaf(Transport t, TcpTransport tcp, String key) {
    if (key.startsWith("socket.")) return "?";
    if (key.startsWith("wireFormat.")) {
      Object wf = tcp.getWireFormat();
      try {
        Object info = wf.getClass().getMethod("getPreferedWireFormatInfo").invoke(wf);
        return read(info, key.substring("wireFormat.".length()));
      } catch (Exception e) {
        return read(wf, key.substring("wireFormat.".length()));
      }
    }
    String v = read(tcp, key);
    if (!v.equals("?")) return v;
    Transport layer = t;
    while (layer != null) {
      v = read(layer, key);
      if (!v.equals("?")) return v;
      try {
        layer = (Transport) layer.getClass().getMethod("getNext").invoke(layer);
      } catch (Exception e) {
        layer = null;
      }
    }
    return "?";
  }

  /** target's property `path` (dotted: prefetchPolicy.queuePrefetch) read back, "?" if no getter. */
  static String read(Object target, String path) {
    try {
      Object o = target;
      for (String part : path.split("\\.")) {
        if (o == null || part.isEmpty()) return "?";
        String cap = Character.toUpperCase(part.charAt(0)) + part.substring(1);
        Method m = null;
        for (String prefix : new String[] {"get", "is"}) {
          try {
            m = o.getClass().getMethod(prefix + cap);
            break;
          } catch (NoSuchMethodException e) {
            // next
          }
        }
        if (m == null) return "?";
        m.setAccessible(true);
        o = m.invoke(o);
      }
      if (o instanceof Object[]) return String.join(",", Arrays.stream((Object[]) o).map(String::valueOf).toArray(String[]::new));
      return String.valueOf(o);
    } catch (Exception e) {
      return "?";
    }
  }
}
