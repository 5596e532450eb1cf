package annals.axon;

import org.axonframework.messaging.eventstreaming.Tag;

/**
 * Axon's tags are key/value pairs; an Annals tag is one string. A tag is written as its key, in
 * which {@code %} and {@code :} are escaped ({@code %25}, {@code %3A}), a colon, then its value
 * as it is, so that the first colon always ends the key and every pair reads back as it was.
 */
public final class TagCodec {

    private TagCodec() {
    }

    public static String encode(Tag tag) {
        return tag.key().replace("%", "%25").replace(":", "%3A") + ":" + tag.value();
    }

    public static Tag decode(String tag) {
        int colon = tag.indexOf(':');
        String key = colon < 0 ? tag : tag.substring(0, colon);
        String value = colon < 0 ? "" : tag.substring(colon + 1);
        return new Tag(unescape(key), value);
    }

    private static String unescape(String key) {
        StringBuilder out = new StringBuilder(key.length());
        for (int i = 0; i < key.length(); i++) {
            if (key.startsWith("%25", i)) {
                out.append('%');
                i += 2;
            } else if (key.startsWith("%3A", i)) {
                out.append(':');
                i += 2;
            } else {
                out.append(key.charAt(i));
            }
        }
        return out.toString();
    }
}
