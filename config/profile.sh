# shellcheck shell=sh
# torchlab: Debian's /etc/profile resets PATH for login shells; put the env back in front.
case ":$PATH:" in
    *:/opt/env/bin:*) ;;
    *) PATH="/opt/env/bin:$PATH" ;;
esac
export PATH
